"""The notification outbox: rows by state, their delivery attempts, and replaying dead
letters."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.db.models import QuerySet
from django.http import HttpRequest
from django.utils.html import format_html
from django.utils.safestring import SafeString
from django.utils.text import Truncator
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy, ngettext, ngettext_lazy

from jobstate.admin.common import (
    ActionRow,
    ActionSpec,
    ReadOnlyAdmin,
    ReadOnlyInline,
    admin_change_url,
    choice_badge,
    confirmed_action,
    counted,
    exact_search,
    permission_check,
    redacted_field,
    row_redactor,
)
from jobstate.admin.display import delivery_attempts_text, moment, short_id
from jobstate.admin.filters import ChannelFilter, OfferedChoicesFilter
from jobstate.admin.list_cells import cut_middle, one_line, with_sub
from jobstate.admin.page_bases import moment_field
from jobstate.console.redaction import Redactor, redactor
from jobstate.models import DeliveryAttempt, DeliveryReplay, Job, Notification
from jobstate.stores import get_state_store
from jobstate.stores.base import DeliveryRequeueOutcome, NotificationState

__all__ = ["NotificationAdmin"]


_DELIVERY_ATTEMPT_FIELDS: tuple[str, ...] = (
    "number",
    "relay_id",
    "started",
    "finished",
    "succeeded",
    "error_text",
)


def notification_redactor(notification: Notification) -> Redactor:
    """The redactor of a notification's page: its payload's redacted members, whose
    values are also masked in its error texts."""
    return row_redactor(notification, lambda: redactor(notification.payload))


class DeliveryAttemptInline(ReadOnlyInline):
    model = DeliveryAttempt
    fields = _DELIVERY_ATTEMPT_FIELDS
    readonly_fields = _DELIVERY_ATTEMPT_FIELDS
    # As they ran: a replay numbers its attempts from 1 again, and by number the rounds
    # would interleave.
    ordering = ["started_at", "id"]
    # Instants as every console page shows them (seconds, zone), not Django's default.
    started = moment_field("started_at", gettext_lazy("started"))
    finished = moment_field("finished_at", gettext_lazy("finished"))

    def get_queryset(self, request: HttpRequest) -> QuerySet[DeliveryAttempt]:
        # Each attempt's error is masked with its notification's redactor.
        return super().get_queryset(request).select_related("notification")

    @admin.display(description=gettext_lazy("error"))
    def error_text(self, attempt: DeliveryAttempt) -> str:
        if not attempt.error:
            return "—"
        return notification_redactor(attempt.notification).text(attempt.error)


_DELIVERY_REPLAY_FIELDS: tuple[str, ...] = ("dlq_key", "requested_by", "created")


class DeliveryReplayInline(ReadOnlyInline):
    model = DeliveryReplay
    fields = _DELIVERY_REPLAY_FIELDS
    readonly_fields = _DELIVERY_REPLAY_FIELDS
    ordering = ["created_at"]
    verbose_name_plural = gettext_lazy("replays")
    created = moment_field("created_at", gettext_lazy("created"))


def _label(notification: Notification) -> str:
    """The row as a confirmation and its messages name it: its channel, destination and
    id, shortened in the middle (one job's notifications often share the first two)."""
    destination = Truncator(notification.destination).chars(60)
    return f"{notification.channel} → {destination} ({cut_middle(str(notification.pk))})"


_NOTIFICATION_FIELDS: tuple[str, ...] = (
    "id",
    "job_link",
    "channel",
    "destination",
    "state_display",
    "attempts_text",
    "next_attempt_at",
    "lease_until",
    "relay_id",
    "delivered_at",
    "created_at",
    "updated_at",
    "idempotency_key",
    "payload_json",
    "last_error_text",
)


@admin.register(Notification)
class NotificationAdmin(ReadOnlyAdmin):
    """Outbox rows are written with their job's transition and moved by relays; here
    they are browsed, and dead letters are replayed once through the store."""

    # The delivery (its attempts, when delivered or the next attempt) sits under the
    # state, the destination under the channel.
    list_display = ["id_cell", "state_cell", "channel_cell", "job_link", "created"]
    # The id links to the row itself (beside its copy button, which a link must not hold).
    list_display_links = None
    phone_hidden_columns = ("created",)
    empty_list_text = gettext_lazy(
        "No notifications. A notification is written with its job's transition when the "
        "job asked to be told (a callback URL or a configured channel); relays deliver it "
        "after the commit, and it stays here with its attempts until it is pruned."
    )
    list_filter = [("state", OfferedChoicesFilter), ChannelFilter]
    list_select_related = ["job"]
    search_fields = ["idempotency_key"]
    search_help_text = gettext_lazy("An exact notification id, job id or idempotency key.")
    # Served by the jobstate_notif_recent_idx index.
    ordering = ["-created_at"]
    actions = ["replay_dead_letters"]
    inlines = [DeliveryAttemptInline, DeliveryReplayInline]
    fields = _NOTIFICATION_FIELDS
    readonly_fields = _NOTIFICATION_FIELDS
    redaction_sources = ("payload",)

    def get_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        fields = super().get_fields(request, obj)
        # Only a pending row is tried again: a dead, delivered or delivering one keeps
        # the time its last retry was due, which would read as a retry to come.
        if obj is not None and obj.state != NotificationState.PENDING:
            return [name for name in fields if name != "next_attempt_at"]
        return fields

    def search(self, queryset: QuerySet[Any], term: str) -> QuerySet[Any]:
        return exact_search(
            queryset, term, uuid_fields=["id", "job_id"], text_fields=["idempotency_key"]
        )

    @admin.display(description=gettext_lazy("id"), ordering="id")
    def id_cell(self, notification: Notification) -> SafeString | str:
        url = admin_change_url(Notification, notification.pk, self.admin_site.name)
        return short_id(notification.pk, url)

    @admin.display(description=gettext_lazy("attempts"))
    def attempts_text(self, notification: Notification) -> str:
        listed = notification.delivery_attempts.count()
        if listed <= notification.attempts:
            return str(notification.attempts)
        return delivery_attempts_text(notification.attempts, listed)

    @admin.display(description=gettext_lazy("state"), ordering="state")
    def state_cell(self, notification: Notification) -> SafeString | str:
        """The state and its attempts; under them when it was delivered, or when the next
        attempt is due."""
        badge = format_html(
            "{} {}",
            self.state_display(notification),
            ngettext("%(n)d attempt", "%(n)d attempts", notification.attempts)
            % {"n": notification.attempts},
        )
        if notification.delivered_at is not None:
            return with_sub(badge, moment(notification.delivered_at))
        if notification.state == NotificationState.PENDING and notification.next_attempt_at:
            return with_sub(
                badge, format_html("{} {}", _("next"), moment(notification.next_attempt_at))
            )
        return badge

    @admin.display(description=gettext_lazy("channel / destination"), ordering="channel")
    def channel_cell(self, notification: Notification) -> SafeString | str:
        destination = notification.destination
        return with_sub(notification.channel, one_line(destination, destination))

    created = moment_field("created_at", gettext_lazy("created"))

    @admin.display(description=gettext_lazy("destination"))
    def destination_short(self, notification: Notification) -> str:
        return Truncator(notification.destination).chars(60)

    @admin.display(description=gettext_lazy("state"), ordering="state")
    def state_display(self, notification: Notification) -> SafeString:
        return choice_badge(notification.state, NotificationState(notification.state).label)

    @admin.display(description=gettext_lazy("job"))
    def job_link(self, notification: Notification) -> Any:
        if notification.job_id is None:
            return "—"
        url = admin_change_url(Job, notification.job_id, self.admin_site.name)
        job = notification.job
        request_id = job.request_id if job else "—"
        return one_line(
            format_html('<a href="{}">{}</a>', url, cut_middle(request_id, 8)), request_id
        )

    payload_json = redacted_field("payload", gettext_lazy("payload"))
    last_error_text = redacted_field("last_error", gettext_lazy("last error"), text=True)

    has_replay_notification_permission = permission_check("replay_notification")

    replay_dead_letters = confirmed_action(
        "replay_spec",
        description=gettext_lazy("Replay selected dead letters once…"),
        permission="replay_notification",
    )

    def replay_spec(self, request: HttpRequest) -> ActionSpec:
        by = self.operator(request)
        reasons = {
            DeliveryRequeueOutcome.ALREADY_REQUEUED: _("this dead letter was already replayed"),
            DeliveryRequeueOutcome.KEY_CONFLICT: _("its replay key was used for another row"),
            DeliveryRequeueOutcome.NOT_DEAD: _("no longer a dead letter"),
            DeliveryRequeueOutcome.NOT_FOUND: _("no longer exists"),
        }

        def row(notification: Notification) -> ActionRow:
            state = NotificationState(notification.state)
            why = (
                None
                if state == NotificationState.DEAD
                else _("%(state)s, not dead") % {"state": state.label}
            )
            detail = ngettext(
                "%(state)s after %(n)d attempt",
                "%(state)s after %(n)d attempts",
                notification.attempts,
            ) % {"state": state.label, "n": notification.attempts}
            return ActionRow(notification, _label(notification), detail, why)

        def perform(
            request: HttpRequest, notification: Notification, inputs: dict[str, Any]
        ) -> str | None:
            # One key per death of the row: two operators replaying the same dead letter
            # at once share it, so the store replays it once; a row that dies again
            # after its replay gets the next key.
            replays = DeliveryReplay.objects.filter(notification_id=notification.pk).count()
            outcome = get_state_store().requeue_delivery_job_once(
                notification_id=notification.pk,
                dlq_key=f"dlq:{notification.pk}:{replays + 1}",
                requested_by=by,
            )
            return None if outcome is DeliveryRequeueOutcome.REQUEUED else reasons[outcome]

        return ActionSpec(
            title=_("Replay dead letters"),
            intro=_(
                "Each dead notification goes back to pending, due at once, with its "
                "attempts reset; the same row is sent again (same id and idempotency key, so "
                "the receiver can drop a repeat). Each dead letter replays once, even if you "
                "confirm twice; a “dlq_resend_ok” audit entry names you."
            ),
            confirm_label=_("Yes, replay"),
            done=counted(
                ngettext_lazy(
                    "Replayed %(count)d dead letter.", "Replayed %(count)d dead letters.", "count"
                )
            ),
            row=row,
            perform=perform,
        )
