"""The Overview page's entry among the app's models: on the admin's index, the app's
page and the navigation sidebar, a link to ``admin:jobstate_dashboard`` (served by
:class:`~jobstate.admin.jobs.JobAdmin`)."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.urls import URLPattern, path, reverse

from jobstate.models import Job, Overview

__all__ = ["OverviewAdmin"]


@admin.register(Overview)
class OverviewAdmin(admin.ModelAdmin):
    """Listed for whoever may view jobs; its one URL leads to the Overview page."""

    def get_urls(self) -> list[URLPattern]:
        opts = self.opts
        return [
            path(
                "",
                self.admin_site.admin_view(self.changelist_view),
                name=f"{opts.app_label}_{opts.model_name}_changelist",
            )
        ]

    def changelist_view(
        self, request: HttpRequest, extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        return HttpResponseRedirect(reverse(f"{self.admin_site.name}:jobstate_dashboard"))

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return request.user.has_perm(f"{Job._meta.app_label}.view_job")

    def has_module_permission(self, request: HttpRequest) -> bool:
        return self.has_view_permission(request)

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False
