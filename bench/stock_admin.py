"""The stock Django admin configuration the admin scale benchmark compares against.

What a project gets from a plain ``ModelAdmin`` with a few list filters: Django's
default paginator (an exact ``COUNT(*)`` of the filtered rows), the full result count
(a second, unfiltered ``COUNT(*)`` on filtered pages) and the model's own ordering. It
lives on a separate :class:`~django.contrib.admin.AdminSite` under ``/stock-admin/`` so
the two configurations answer side by side in one process, on one database.

This module is a URLconf: the benchmark points ``ROOT_URLCONF`` at it.
"""

from __future__ import annotations

from django.contrib import admin
from django.urls import URLPattern, URLResolver, include, path

from jobstate.models import AuditEntry, Job

stock_site = admin.AdminSite(name="stock_admin")


class StockJobAdmin(admin.ModelAdmin):
    list_display = ["id", "request_id", "status", "target", "source", "attempts", "created_at"]
    list_filter = ["status", "target"]


class StockAuditEntryAdmin(admin.ModelAdmin):
    list_display = ["ts", "event", "stage", "severity", "request_id", "title"]
    list_filter = ["stage", "severity"]


stock_site.register(Job, StockJobAdmin)
stock_site.register(AuditEntry, StockAuditEntryAdmin)

urlpatterns: list[URLPattern | URLResolver] = [
    path("stock-admin/", stock_site.urls),
    path("", include("project.urls")),
]
