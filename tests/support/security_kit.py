"""Helpers of the security tests: staff users with exact permissions, CSRF-enforcing
clients, and what an action leaves behind."""

from __future__ import annotations

from typing import Any

from django.contrib.auth.models import Permission
from django.db.models import Model
from django.test import Client

from jobstate.models import ApprovalDecision, AuditEntry, DeliveryReplay, Job
from jobstate.stores.database import DatabaseStateStore
from tests.support.admin_kit import failed_job

OPERATOR = "olga.operator"


def changelist_url(model: type[Model]) -> str:
    return f"/admin/jobstate/{model._meta.model_name}/"


def _failed_job() -> str:
    return str(failed_job(DatabaseStateStore(), "broken").id)


def _queued_job() -> str:
    return str(DatabaseStateStore().create_job(request_id="waiting", target="mail").id)


def _job_status(pk: str) -> str:
    return Job.objects.get(pk=pk).status


def staff(django_user_model: Any, username: str, permissions: list[Permission]) -> Any:
    user = django_user_model.objects.create_user(username=username, password=None, is_staff=True)
    user.user_permissions.add(*permissions)
    return user


def jobstate_permissions() -> Any:
    return Permission.objects.filter(content_type__app_label="jobstate")


def view_permission(model: type[Model]) -> Permission:
    return jobstate_permissions().get(codename=f"view_{model._meta.model_name}")


def snapshot() -> tuple[int, int, int]:
    """What an action leaves behind besides the row itself."""
    return (
        AuditEntry.objects.count(),
        ApprovalDecision.objects.count(),
        DeliveryReplay.objects.count(),
    )


def csrf_client(user: Any) -> Client:
    client = Client(enforce_csrf_checks=True)
    client.force_login(user)
    return client
