"""The figures and charts of the admin's Overview page.

Everything is computed on the server and drawn as inline SVG by the template: no
CDN, and no script needed (a small static script refreshes the page in place; see
``jobstate/static/jobstate/live.js``). The page costs five queries whatever the table
sizes: the two of
:meth:`~jobstate.stores.base.StateStore.operational_metrics_snapshot`, two grouped
counts of the jobs that finished in the last hour (by minute) and the last 24 hours
(by hour), both by status on the ``(status, updated_at)`` index, and one grouped count
of the queue by target (on the partial index of queued jobs).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from urllib.parse import urlencode

from django.db.models import Count, Q
from django.db.models.functions import Now, TruncHour, TruncMinute
from django.urls import NoReverseMatch, reverse
from django.utils import timezone
from django.utils.safestring import SafeString
from django.utils.translation import gettext as _

from jobstate.admin.common import BADGE_COLOURS, short_duration
from jobstate.admin.list_cells import breakable
from jobstate.admin.status_words import shared_status_label
from jobstate.models import Job
from jobstate.stores.base import TERMINAL_JOB_STATUSES, JobOperationalMetrics, JobStatus

__all__ = [
    "Bar",
    "Card",
    "DepthRow",
    "FinishedChart",
    "QueueDepthChart",
    "cards",
    "endpoint_links",
    "finished_per_hour",
    "finished_per_minute",
    "queue_depth_by_target",
]

#: The finished-jobs chart's window, one bar per minute.
CHART_MINUTES = 60
#: The throughput chart's window, one bar per hour.
CHART_HOURS = 24
#: The queue-depth chart lists the deepest targets, the rest summed as one row.
DEPTH_TARGETS = 12
#: A part of a target's name (between its dots, dashes, underscores and colons) longer
#: than this many characters may break anywhere on the Overview; shorter ones stay whole.
LONG_NAME_PART = 24

_TERMINAL_ORDER = [JobStatus.DONE, JobStatus.ERROR, JobStatus.REJECTED]
# Drawn about the size it is shown at beside the other chart on a wide screen, so its
# labels (15 units) stay readable when the box scales it down to a phone.
_CHART_WIDTH = 480
_CHART_HEIGHT = 150
_BAR_GAP = 2
_MARGIN_LEFT = 56
_MARGIN_RIGHT = 8
_MARGIN_TOP = 8
_MARGIN_BOTTOM = 26


@dataclass(frozen=True)
class Card:
    label: str
    value: str
    link: str = ""
    """Query string of the jobs changelist that lists what the card counts."""
    alert: bool = False
    help: str = ""
    """What the figure means, under it (and in its tooltip)."""


def _age(seconds: float) -> str:
    return short_duration(seconds) if seconds > 0 else "—"


def cards(snapshot: JobOperationalMetrics) -> tuple[list[Card], list[Card]]:
    """The snapshot as two rows of cards: jobs per status, then the health figures."""
    # "≈": the store estimated the count from table statistics (a large history). A
    # card counts tasks and other jobs: it names both words, as the status filter does.
    statuses = [
        Card(
            shared_status_label(status),
            f"≈ {count:,}" if status in snapshot.estimated_statuses else f"{count:,}",
            f"?status__exact={status}",
        )
        for status, count in snapshot.by_status.items()
    ]
    finished = sum(snapshot.terminal_last_15m.values())
    failed = snapshot.terminal_last_15m.get(JobStatus.ERROR.value, 0)
    health = [
        Card(
            _("Finished in the last 15 min"),
            " · ".join(
                f"{shared_status_label(status)} {count:,}"
                for status, count in snapshot.terminal_last_15m.items()
            )
            or "0",
            alert=bool(finished and failed * 2 > finished),
        ),
        Card(
            _("Oldest queued job"),
            _age(snapshot.oldest_queued_age_seconds),
            "?status__exact=queued",
        ),
        Card(
            _("Delayed queued jobs"),
            f"{snapshot.delayed_queued_jobs:,}",
            "?delayed=yes",
        ),
        Card(
            _("Expired leases"),
            f"{snapshot.expired_leases:,}",
            "?lease=expired",
            alert=snapshot.expired_leases > 0,
        ),
        Card(
            _("Blocked threads"),
            f"{snapshot.blocked_threads:,}",
            help=_(
                "Conversation threads whose next queued job waits for an earlier job "
                "of the same thread to finish (jobs of one thread run one at a time)."
            ),
        ),
    ]
    return statuses, health


@dataclass(frozen=True)
class Bar:
    x: float
    y: float
    width: float
    height: float
    colour: str
    title: str


@dataclass(frozen=True)
class FinishedChart:
    width: int
    height: int
    bars: list[Bar]
    peak: int
    ticks: list[tuple[float, str]]
    """``(x, label)`` of the time axis."""
    rows: list[tuple[str, dict[str, int]]]
    """The data behind the bars: minute label and count per status."""
    total: int
    legend: list[tuple[str, str]]

    @property
    def gridlines(self) -> list[tuple[float, str]]:
        """``(y, label)`` of the horizontal guides: the peak, a whole number near its
        half (jobs are counted whole), zero."""
        if not self.peak:
            return [(float(self.height), "0")]
        lines = [(0.0, f"{self.peak:,}")]
        middle = self.peak // 2
        if middle:
            lines.append((round(self.height * (1 - middle / self.peak), 2), f"{middle:,}"))
        return [*lines, (float(self.height), "0")]

    @property
    def svg_width(self) -> int:
        return self.width + _MARGIN_LEFT + _MARGIN_RIGHT

    @property
    def svg_height(self) -> int:
        return self.height + _MARGIN_TOP + _MARGIN_BOTTOM

    @property
    def plot_origin(self) -> str:
        """The ``transform`` that places the plot inside its margins."""
        return f"translate({_MARGIN_LEFT},{_MARGIN_TOP})"


def finished_per_minute(now: datetime | None = None) -> FinishedChart:
    """Jobs that reached done, error or rejected in each of the last 60 minutes (by
    ``updated_at``, the instant of their last transition), stacked by status. One
    ``GROUP BY`` query on the ``(status, updated_at)`` index."""
    return _finished_chart(now, timedelta(minutes=1), CHART_MINUTES, TruncMinute, "%H:%M", 10)


def finished_per_hour(now: datetime | None = None) -> FinishedChart:
    """As :func:`finished_per_minute`, one bar per hour over the last 24 hours. The
    ``(status, updated_at)`` index serves it too: the three terminal statuses, each a
    range of ``updated_at``, grouped by hour without reading a job row when the table's
    visibility map is current (an index-only scan)."""
    return _finished_chart(now, timedelta(hours=1), CHART_HOURS, TruncHour, "%H:00", 4)


def _finished_chart(
    now: datetime | None,
    step: timedelta,
    buckets: int,
    trunc: type[TruncMinute] | type[TruncHour],
    label_format: str,
    tick_every: int,
) -> FinishedChart:
    now = (now or timezone.now()).astimezone(UTC)
    last = now.replace(second=0, microsecond=0)
    if step >= timedelta(hours=1):
        last = last.replace(minute=0)
    first = last - step * (buckets - 1)
    grouped = (
        Job.objects.filter(status__in=list(TERMINAL_JOB_STATUSES), updated_at__gte=first)
        .annotate(bucket=trunc("updated_at", tzinfo=UTC))
        .order_by()
        .values_list("bucket", "status")
        # COUNT(*), not COUNT(id): the id is not in the index, the row count is, so the
        # scan reads the index alone while the visibility map is current.
        .annotate(n=Count("*"))
    )
    counts: dict[datetime, dict[str, int]] = {}
    for bucket, status, n in grouped:
        counts.setdefault(bucket.astimezone(UTC), {})[status] = n
    starts = [first + step * i for i in range(buckets)]
    peak = max((sum(counts.get(m, {}).values()) for m in starts), default=0)
    scale = _CHART_HEIGHT / max(peak, 1)
    slot = _CHART_WIDTH / buckets
    bars: list[Bar] = []
    rows: list[tuple[str, dict[str, int]]] = []
    local = timezone.get_current_timezone()
    for index, start in enumerate(starts):
        label = start.astimezone(local).strftime(label_format)
        per_status = counts.get(start, {})
        rows.append((label, {s.value: per_status.get(s.value, 0) for s in _TERMINAL_ORDER}))
        top = float(_CHART_HEIGHT)
        for status in _TERMINAL_ORDER:
            n = per_status.get(status.value, 0)
            if not n:
                continue
            height = n * scale
            top -= height
            bars.append(
                Bar(
                    x=round(index * slot + _BAR_GAP / 2, 2),
                    y=round(top, 2),
                    width=round(slot - _BAR_GAP, 2),
                    height=round(height, 2),
                    colour=BADGE_COLOURS[status],
                    title=f"{label} {status.label}: {n:,}",
                )
            )
    ticks = [
        (round(index * slot, 2), starts[index].astimezone(local).strftime(label_format))
        for index in range(0, buckets, tick_every)
    ]
    return FinishedChart(
        width=_CHART_WIDTH,
        height=_CHART_HEIGHT,
        bars=bars,
        peak=peak,
        ticks=ticks,
        rows=[row for row in rows if any(row[1].values())],
        total=sum(sum(per.values()) for per in counts.values()),
        legend=[(str(s.label), BADGE_COLOURS[s]) for s in _TERMINAL_ORDER],
    )


@dataclass(frozen=True)
class DepthRow:
    target: str
    ready: int
    delayed: int
    ready_width: float
    delayed_width: float
    link: str

    @property
    def total(self) -> int:
        return self.ready + self.delayed

    @property
    def shown_target(self) -> SafeString:
        """The target, wrapping after its dots, dashes, underscores and colons: on a
        phone a name that could break anywhere read "tasks:defa/ult"."""
        return breakable(self.target, "._-:/", long_part=LONG_NAME_PART)


@dataclass(frozen=True)
class QueueDepthChart:
    width: int
    rows: list[DepthRow]
    total: int


def queue_depth_by_target() -> QueueDepthChart:
    """Queued jobs per target, split into ready and delayed (``run_after`` ahead on the
    database clock); the deepest :data:`DEPTH_TARGETS` targets, the rest summed."""
    delayed = Q(run_after__gt=Now())
    grouped = list(
        Job.objects.queued()
        .order_by()
        .values_list("target")
        .annotate(total=Count("id"), delayed=Count("id", filter=delayed))
        .order_by("-total", "target")
    )
    shown, rest = grouped[:DEPTH_TARGETS], grouped[DEPTH_TARGETS:]
    entries = [(target, total - late, late) for target, total, late in shown]
    if rest:
        entries.append(
            (
                _("%(n)d other targets") % {"n": len(rest)},
                sum(total - late for _target, total, late in rest),
                sum(late for _target, _total, late in rest),
            )
        )
    widest = max((ready + late for _target, ready, late in entries), default=0)
    scale = 480 / max(widest, 1)
    rows = [
        DepthRow(
            target=target if target is not None else _("(no target)"),
            ready=ready,
            delayed=late,
            ready_width=round(ready * scale, 2),
            delayed_width=round(late * scale, 2),
            link=(
                "?" + urlencode({"status__exact": JobStatus.QUEUED.value, "target": target})
                if target is not None and index < len(shown)
                else ""
            ),
        )
        for index, (target, ready, late) in enumerate(entries)
    ]
    return QueueDepthChart(width=480, rows=rows, total=sum(row.total for row in rows))


def endpoint_links() -> list[tuple[str, str]]:
    """``(label, URL)`` of the health and metrics endpoints the site routes
    (``jobstate.urls``, included by the host where it wants them); none it does not."""
    links = []
    for name, label in (("jobstate:metrics", _("Metrics")), ("jobstate:ready", _("Readiness"))):
        try:
            links.append((label, reverse(name)))
        except NoReverseMatch:
            continue  # the host does not route this endpoint
    return links
