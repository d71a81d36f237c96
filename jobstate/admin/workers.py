"""The Workers page: every registered worker process (task workers, relay loops and the
executors their claims register) with
its host, pid, backend, queues, concurrency, start, last beat, state, and the jobs it is
running now, linked.

A worker is *live* while its last beat is within its lease, *lost* when the beat is
older (killed, hung, or cut off from the database) and *stopped* when it said so on a
graceful exit; all judged on the database's clock, read by the page's own SELECT.
Workers are registered and forgotten by the processes and the retention sweep
(``prune_jobstate``), never edited here. The page refreshes itself in place
(``jobstate/static/jobstate/live.js``).

A page of workers costs a fixed number of queries: the page of rows (with the state
and the database clock computed in the same SELECT), and two for the jobs they hold —
a grouped count per worker and the first few jobs of each, by a window function —
whatever the size of the jobs table.
"""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import urlencode

from django.contrib import admin, messages
from django.contrib.admin.views.main import ChangeList
from django.core.exceptions import PermissionDenied
from django.db.models import Case, Count, F, QuerySet, Value, When, Window
from django.db.models.functions import Now, RowNumber
from django.http import HttpRequest, HttpResponse, HttpResponseNotAllowed, HttpResponseRedirect
from django.urls import URLPattern, path, reverse
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString, mark_safe
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy

from jobstate.admin.common import (
    ReadOnlyAdmin,
    admin_change_url,
    database_now,
    relative_time,
    status_badge,
    with_database_now,
)
from jobstate.admin.display import job_link, moment
from jobstate.admin.filters import OfferedChoicesFilter, offered_value
from jobstate.admin.list_cells import age_cell, cut_middle, cut_path, one_line, with_sub
from jobstate.admin.list_input import unusable_find_value
from jobstate.admin.worker_page import worker_jobs
from jobstate.console.job_search import shortened
from jobstate.core.bidi import isolated
from jobstate.core.states import CLAIMED_JOB_STATUSES, WorkerKind
from jobstate.models import Job, Worker

__all__ = ["RUNNING_SHOWN", "WorkerAdmin", "WorkerStateFilter", "worker_state"]

#: How many of a worker's running jobs its row links; the rest are counted.
RUNNING_SHOWN = 5
#: How many characters of a running job's task path its row shows beside its id (the
#: 18em of ``.field-running_now a`` in ``console.css``, less the id's).
RUNNING_NAME_SHOWN = 21

_STATE_COLOURS = {"live": "#1a7f37", "lost": "#cf222e", "stopped": "#6e7781"}


def worker_state() -> Case:
    """``"stopped"``, ``"lost"`` or ``"live"`` for each worker, on the database clock."""
    return Case(
        When(stopped_at__isnull=False, then=Value("stopped")),
        When(heartbeat_at__lt=Now() - F("lease"), then=Value("lost")),
        default=Value("live"),
    )


def _state_label(state: str) -> str:
    return {"live": _("live"), "lost": _("lost"), "stopped": _("stopped")}.get(state, state)


class WorkerStateFilter(admin.SimpleListFilter):
    title = gettext_lazy("state")
    parameter_name = "state"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [(state, _state_label(state)) for state in ("live", "lost", "stopped")]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        value = offered_value(self, ("live", "lost", "stopped"))
        if value is not None:
            return queryset.filter(state=value)
        return queryset


class WorkerChangeList(ChangeList):
    """Loads the jobs the page's workers hold in two queries, after the page itself."""

    def get_results(self, request: HttpRequest) -> None:
        super().get_results(request)
        workers = list(self.result_list)
        ids = [worker.worker_id for worker in workers]
        if not ids:
            return
        claimed = Job.objects.filter(status__in=list(CLAIMED_JOB_STATUSES), executor_id__in=ids)
        counts = dict(
            claimed.order_by()
            .values_list("executor_id")
            .annotate(n=Count("id"))
            .values_list("executor_id", "n")
        )
        ranked = claimed.annotate(
            rank=Window(
                RowNumber(),
                partition_by=[F("executor_id")],
                order_by=[F("claimed_at").asc(), F("id").asc()],
            )
        ).filter(rank__lte=RUNNING_SHOWN)
        shown: dict[str, list[tuple[Any, str]]] = {}
        for pk, owner, task_path, target in ranked.order_by("executor_id", "rank").values_list(
            "id", "executor_id", "task_path", "target"
        ):
            shown.setdefault(owner or "", []).append((pk, task_path or target or str(pk)))
        for worker in workers:
            worker.running_jobs = shown.get(worker.worker_id, [])
            worker.running_count = counts.get(worker.worker_id, 0)


#: What a worker is and where it runs: the first columns of the list and of its page.
_IDENTITY = (
    "worker_id",
    "state_display",
    "kind",
    "host",
    "pid",
    "backend",
    "queues_display",
    "concurrency",
)

#: A task worker's own: a relay has no backend and runs no jobs; an executor, registered
#: by its claims, declares neither (its row's concurrency of 1 says nothing: it holds
#: as many jobs as it claimed).
_TASK_WORKER_FIELDS = ("backend", "concurrency")

_WORKER_FIELDS = (
    *_IDENTITY,
    "lease",
    "started_moment",
    "heartbeat_moment",
    "stopped_moment",
    "stopped_reason",
)


#: Between the jobs a worker runs: a comma on a wide screen; on a phone, where each job
#: takes a line of its own, none (a comma left alone on its line otherwise).
_LINK_SEPARATOR = mark_safe('<span class="jobstate-list-sep">, </span>')


@admin.register(Worker)
class WorkerAdmin(ReadOnlyAdmin):
    """Registered workers: who runs, where, on which queues, and what each runs now."""

    # Where a worker runs sits under its id, its concurrency beside its queues, when it
    # started under its last beat: "running now" fits a 1440 px screen.
    list_display = [
        "worker_cell",
        "state_cell",
        "queues_cell",
        "last_beat",
        "running_now",
    ]
    phone_hidden_columns = ("queues_cell",)
    empty_list_text = gettext_lazy(
        "No workers. A worker registers here when it starts (manage.py jobstate_worker, "
        "a hub worker or an executor), beats while it runs and stays listed, stopped, "
        "after it exits until it is pruned."
    )
    list_filter = [WorkerStateFilter, ("kind", OfferedChoicesFilter)]
    search_fields = ["worker_id"]
    search_help_text = gettext_lazy("A worker id, a host or a pid, exactly.")
    ordering = ["-started_at", "-id"]
    actions = None
    fields = _WORKER_FIELDS
    readonly_fields = _WORKER_FIELDS
    change_form_template = "admin/jobstate/worker/change_form.html"

    def get_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        fields = super().get_fields(request, obj)
        if obj is not None and obj.kind != WorkerKind.TASKS:
            return [name for name in fields if name not in _TASK_WORKER_FIELDS]
        return fields

    def get_urls(self) -> list[URLPattern]:
        find = path(
            "find/",
            self.admin_site.admin_view(self.find_view),
            name="jobstate_worker_find",
        )
        return [find, *super().get_urls()]

    def find_view(self, request: HttpRequest) -> HttpResponse:
        """The page of the worker whose id is ``?id=``: what a worker's name links to
        wherever a job shows it, so a link costs no query until it is followed. A
        worker id no row holds (an executor of a store without a registry, a worker the
        retention sweep forgot) leads to the jobs that name it."""
        if not self.has_view_permission(request):
            raise PermissionDenied
        if request.method not in ("GET", "HEAD"):
            return HttpResponseNotAllowed(["GET", "HEAD"])
        worker_id = request.GET.get("id", "")
        workers = reverse(f"{self.admin_site.name}:jobstate_worker_changelist")
        unusable = unusable_find_value(worker_id, _("worker id"))
        if unusable is not None:
            messages.warning(request, unusable)
            return HttpResponseRedirect(workers)
        longest = Worker._meta.get_field("worker_id").max_length
        if longest is not None and len(worker_id) > longest:
            # No worker has such an id, and no job can name one: no query to make.
            messages.warning(
                request,
                _("No worker id is longer than %(longest)d characters.") % {"longest": longest},
            )
            return HttpResponseRedirect(workers)
        pk = Worker.objects.filter(worker_id=worker_id).values_list("pk", flat=True).first()
        if pk is not None:
            return HttpResponseRedirect(admin_change_url(Worker, pk, self.admin_site.name))
        messages.info(
            request,
            _("No registered worker is called %(id)s; these are the jobs that name it.")
            % {"id": shortened(worker_id)},
        )
        search = "worker:" + json.dumps(worker_id)
        jobs = reverse(f"{self.admin_site.name}:jobstate_job_changelist")
        return HttpResponseRedirect(f"{jobs}?{urlencode({'q': search})}")

    def render_change_form(
        self,
        request: HttpRequest,
        context: dict[str, Any],
        add: bool = False,
        change: bool = False,
        form_url: str = "",
        obj: Worker | None = None,
    ) -> HttpResponse:
        if obj is not None:
            context["worker_jobs"] = worker_jobs(obj, database_now(obj), self.admin_site.name)
            context["worker_search_url"] = (
                reverse(f"{self.admin_site.name}:jobstate_job_changelist")
                + "?"
                + urlencode({"q": "worker:" + json.dumps(obj.worker_id)})
            )
        return super().render_change_form(request, context, add, change, form_url, obj)

    def get_queryset(self, request: HttpRequest) -> QuerySet[Worker]:
        return with_database_now(super().get_queryset(request)).annotate(state=worker_state())

    def get_changelist(self, request: HttpRequest, **kwargs: Any) -> type[ChangeList]:
        return WorkerChangeList

    def search(self, queryset: QuerySet[Any], term: str) -> QuerySet[Any]:
        if not term:
            return queryset
        found = queryset.filter(worker_id=term) | queryset.filter(host=term)
        # ASCII digits only: str.isdigit() takes "²", which int() refuses.
        if term.isascii() and term.isdigit() and len(term) <= 10 and int(term) < 2**31:
            found = found | queryset.filter(pid=int(term))
        return found

    # --- columns ---------------------------------------------------------------------

    @admin.display(description=gettext_lazy("state"))
    def state_display(self, worker: Worker) -> SafeString:
        state = getattr(worker, "state", "live")
        badge = status_badge(_state_label(state), _STATE_COLOURS.get(state, "#6e7781"))
        if state == "stopped" and worker.stopped_reason:
            return format_html('{} <span class="help">{}</span>', badge, worker.stopped_reason)
        return badge

    @admin.display(description=gettext_lazy("queues"))
    def queues_display(self, worker: Worker) -> str:
        if worker.queues is None:
            return _("every queue") if worker.kind == "tasks" else "—"
        return ", ".join(isolated(str(name)) for name in worker.queues)

    @admin.display(description=gettext_lazy("worker"), ordering="worker_id")
    def worker_cell(self, worker: Worker) -> SafeString | str:
        where = f"{worker.get_kind_display()} · {worker.host}:{worker.pid}"
        return with_sub(
            one_line(cut_middle(worker.worker_id, 14), worker.worker_id), one_line(where, where)
        )

    @admin.display(description=gettext_lazy("state"))
    def state_cell(self, worker: Worker) -> SafeString | str:
        """The state's badge; a stopped worker's reason under it, on one line (whole in
        its tooltip and on the worker's page)."""
        state = getattr(worker, "state", "live")
        badge = status_badge(_state_label(state), _STATE_COLOURS.get(state, "#6e7781"))
        if state == "stopped" and worker.stopped_reason:
            return with_sub(badge, one_line(worker.stopped_reason, worker.stopped_reason))
        return badge

    @admin.display(description=gettext_lazy("queues"))
    def queues_cell(self, worker: Worker) -> SafeString | str:
        # Each name in its own element: on a phone's "All columns" it stays whole.
        names = (
            format_html_join(
                ", ",
                '<span class="jobstate-queue-name">{}</span>',
                ((isolated(str(name)),) for name in worker.queues),
            )
            if worker.queues
            else self.queues_display(worker)
        )
        if worker.kind != WorkerKind.TASKS:
            return names
        return with_sub(names, _("concurrency %(n)s") % {"n": worker.concurrency})

    @admin.display(description=gettext_lazy("started"), ordering="started_at")
    def started_display(self, worker: Worker) -> str:
        return relative_time(worker.started_at, database_now(worker))

    @admin.display(description=gettext_lazy("last beat"), ordering="heartbeat_at")
    def last_beat(self, worker: Worker) -> SafeString | str:
        now = database_now(worker)
        started = _("started %(when)s") % {"when": relative_time(worker.started_at, now)}
        return with_sub(age_cell(worker.heartbeat_at, now), started)

    @admin.display(description=gettext_lazy("started"))
    def started_moment(self, worker: Worker) -> SafeString | str:
        return moment(worker.started_at, database_now(worker))

    @admin.display(description=gettext_lazy("last beat"))
    def heartbeat_moment(self, worker: Worker) -> SafeString | str:
        return moment(worker.heartbeat_at, database_now(worker))

    @admin.display(description=gettext_lazy("stopped"))
    def stopped_moment(self, worker: Worker) -> SafeString | str:
        return moment(worker.stopped_at, database_now(worker))

    @admin.display(description=gettext_lazy("running now"))
    def running_now(self, worker: Worker) -> SafeString | str:
        jobs: list[tuple[Any, str]] = getattr(worker, "running_jobs", [])
        count: int = getattr(worker, "running_count", 0)
        if not count:
            return "—"
        # Each job by its name and its id: two attempts of one task read alike without.
        # A long name is cut at its start: its end says what the task is.
        site = self.admin_site.name
        links = format_html_join(
            _LINK_SEPARATOR,
            "{}",
            (
                (
                    job_link(
                        admin_change_url(Job, pk, site),
                        pk,
                        label,
                        cut_path(label, RUNNING_NAME_SHOWN),
                    ),
                )
                for pk, label in jobs
            ),
        )
        rest = count - len(jobs)
        if rest > 0:
            return format_html("{} {}", links, _("and %(n)d more") % {"n": rest})
        return links
