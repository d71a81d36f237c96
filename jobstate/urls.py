"""URLs of the health and metrics endpoints; include them where the host wants them::

path("", include("jobstate.urls")),   # /health/ready and /metrics
"""

from __future__ import annotations

from django.urls import path

from jobstate.observability import views

app_name = "jobstate"

urlpatterns = [
    path("health/ready", views.ready, name="ready"),
    path("metrics", views.metrics, name="metrics"),
]
