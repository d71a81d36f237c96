"""Prometheus text exposition of the operational metrics.

The figures are read from the state store at scrape time by a custom collector on a
private :class:`~prometheus_client.CollectorRegistry`, so nothing is registered in the
process-wide default registry and every scrape shows the database as it is, whichever
process answers.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from jobstate.stores.base import JobOperationalMetrics, StateStore

__all__ = [
    "CONTENT_TYPE",
    "OperationalMetricsCollector",
    "metric_families",
    "render_metrics",
]

#: Content type of :func:`render_metrics`' output (Prometheus text format 0.0.4).
CONTENT_TYPE = CONTENT_TYPE_LATEST


def metric_families(snapshot: JobOperationalMetrics) -> list[Metric]:
    """The six figures of ``snapshot`` (and which counts are estimates) as gauges named
    ``jobstate_*``."""
    by_status = GaugeMetricFamily(
        "jobstate_jobs", "Jobs per status (every status present).", labels=["status"]
    )
    for status, count in snapshot.by_status.items():
        by_status.add_metric([status], count)
    estimated = GaugeMetricFamily(
        "jobstate_jobs_estimated",
        "1 where jobstate_jobs is estimated from table statistics, 0 where it is exact.",
        labels=["status"],
    )
    for status in snapshot.by_status:
        estimated.add_metric([status], 1 if status in snapshot.estimated_statuses else 0)
    terminal = GaugeMetricFamily(
        "jobstate_jobs_terminal_15m",
        "Jobs that reached a terminal status in the last 15 minutes.",
        labels=["status"],
    )
    for status, count in snapshot.terminal_last_15m.items():
        terminal.add_metric([status], count)
    return [
        by_status,
        estimated,
        terminal,
        GaugeMetricFamily(
            "jobstate_queue_oldest_queued_age_seconds",
            "Age of the oldest queued job, monitor probes excluded; 0 when none is queued.",
            value=snapshot.oldest_queued_age_seconds,
        ),
        GaugeMetricFamily(
            "jobstate_queue_delayed_jobs",
            "Queued jobs whose run_after is still in the future.",
            value=snapshot.delayed_queued_jobs,
        ),
        GaugeMetricFamily(
            "jobstate_jobs_expired_leases",
            "Running or dispatched jobs whose lease has expired.",
            value=snapshot.expired_leases,
        ),
        GaugeMetricFamily(
            "jobstate_threads_blocked",
            "Threads with a queued job waiting behind a running or dispatched one.",
            value=snapshot.blocked_threads,
        ),
    ]


class OperationalMetricsCollector(Collector):
    """Reads ``store.operational_metrics_snapshot(now)`` on every collection."""

    def __init__(self, store: StateStore, now: datetime | None = None) -> None:
        self.store = store
        self.now = now

    def collect(self) -> Iterator[Metric]:
        yield from metric_families(self.store.operational_metrics_snapshot(self.now))


def render_metrics(store: StateStore, *, now: datetime | None = None) -> bytes:
    """The store's operational metrics in the Prometheus text format (one snapshot, so
    one pair of queries per call on the database store). Database errors propagate."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(OperationalMetricsCollector(store, now))
    return generate_latest(registry)
