"""A paginator for tables with millions of rows.

Django's paginator asks for ``COUNT(*)`` of the listed rows on every page, which on
PostgreSQL reads the whole table (or every matching row) each time. This one never
counts more than :attr:`EstimatedCountPaginator.count_cap` rows:

- a list of at most ``count_cap`` rows is counted exactly;
- an unfiltered list on PostgreSQL takes the planner's row estimate
  (``pg_class.reltuples``, kept fresh by autovacuum) when that estimate is beyond the
  cap;
- any other longer list answers ``count_cap + 1``, read as "more than ``count_cap``".

SQLite answers exact counts: it is the embedded backend, its tables stay small and its
``COUNT(*)`` has no estimate to fall back on.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any

from django.core.paginator import EmptyPage, Page, Paginator
from django.db.models import QuerySet
from django.utils.functional import cached_property

from jobstate.stores.database.backends import database_ops

__all__ = ["CountKind", "EstimatedCountPaginator"]


class CountKind(StrEnum):
    """How :attr:`EstimatedCountPaginator.count` was obtained."""

    EXACT = "exact"
    ESTIMATE = "estimate"
    """PostgreSQL's planner estimate of the table's rows."""
    AT_LEAST = "at_least"
    """More than ``count_cap`` rows match; the count says ``count_cap + 1``."""


class EstimatedCountPaginator(Paginator):
    """A :class:`~django.core.paginator.Paginator` whose ``count`` costs at most one
    scan of ``count_cap + 1`` index entries (see the module docstring). ``count_kind``
    says how the count was obtained, so a page can write "about 1,000,000" or "more
    than 10,000" instead of a wrong exact number."""

    #: The most rows a count reads.
    count_cap = 10_000

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.count_kind = CountKind.EXACT

    @cached_property
    def count(self) -> int:
        rows = self.object_list
        if not isinstance(rows, QuerySet):
            return super().count
        ops = database_ops(rows.db)
        if ops.counts_exactly:
            return rows.count()
        if _unfiltered(rows):
            estimate = ops.estimated_rows(rows.model)
            if estimate is not None and estimate > self.count_cap:
                self.count_kind = CountKind.ESTIMATE
                return estimate
        # Counting the pks of a LIMITed subquery lets the database stop after cap + 1
        # index entries instead of reading every matching row.
        capped = rows.order_by().values("pk")[: self.count_cap + 1].count()
        if capped > self.count_cap:
            self.count_kind = CountKind.AT_LEAST
        return capped

    def page(self, number: Any) -> Page:
        """Page ``number``; :class:`EmptyPage` when it is after the first and holds no
        row, as Django refuses a page past an exact count: an estimate may promise
        pages past the list's end, which would show an empty list saying nothing is
        recorded. Reading the page here is the query the list runs anyway: the page
        keeps its rows."""
        page = super().page(number)
        if page.number > 1 and not page.object_list:
            raise EmptyPage(self.error_messages["no_results"])
        return page


def _unfiltered(rows: QuerySet[Any]) -> bool:
    """Whether ``rows`` lists the whole table: no WHERE, no DISTINCT, no set operation."""
    query = rows.query
    return not query.where and not query.distinct and not query.combinator
