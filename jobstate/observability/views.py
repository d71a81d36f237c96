"""Health and metrics endpoints: thin views over the state store.

Both answer only ``GET`` / ``HEAD``, are never cached, and require ``Authorization:
Bearer <JOBSTATE['OBSERVABILITY_TOKEN']>`` when that setting is a string (``None`` leaves
them open, for a host that restricts them at its proxy). A request without the token
gets 401 and a body that says only that, before any query runs. Neither endpoint reveals
a job payload or an error text: they show counts by status, ages and migration names,
and readiness reasons go to the ``jobstate.readiness`` log.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
from collections.abc import Callable
from functools import wraps

from django.db import DatabaseError
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_safe

from jobstate.core.conf import jobstate_settings
from jobstate.observability.metrics import CONTENT_TYPE, render_metrics
from jobstate.stores import get_state_store
from jobstate.stores.database.figures import connection_problem

logger = logging.getLogger("jobstate.readiness")

__all__ = ["metrics", "ready"]

View = Callable[[HttpRequest], HttpResponse]


def _configured_token() -> bytes | None:
    """``JOBSTATE['OBSERVABILITY_TOKEN']`` as bytes, or ``None`` when the endpoints are
    open. The settings refuse a token no client could send (empty, spaces at an end,
    not ASCII), so none is read as "open" or as one anyone can send."""
    token = jobstate_settings.OBSERVABILITY_TOKEN
    return None if token is None else token.encode()


def _token_matches(request: HttpRequest) -> bool:
    token = _configured_token()
    if token is None:
        return True
    scheme, _, given = request.headers.get("Authorization", "").partition(" ")
    # Constant time, and over fixed-length digests: the response time tells neither how
    # much of a guess matched nor how long the token is.
    matches = hmac.compare_digest(
        hashlib.sha256(given.strip().encode()).digest(), hashlib.sha256(token).digest()
    )
    return scheme.lower() == "bearer" and matches


def observability_access(view: View) -> View:
    """Refuse the request with 401 unless the bearer token matches (when one is set)."""

    @wraps(view)
    def guarded(request: HttpRequest) -> HttpResponse:
        if not _token_matches(request):
            response = JsonResponse({"detail": "authentication required"}, status=401)
            response["WWW-Authenticate"] = 'Bearer realm="jobstate"'
            return response
        return view(request)

    return guarded


@never_cache
@require_safe
@observability_access
def ready(request: HttpRequest) -> HttpResponse:
    """200 when the database answers and jobstate's schema is fully migrated, else 503.
    The body names which check failed, never why."""
    readiness = get_state_store().schema_readiness()
    if not readiness.ready:
        logger.warning("jobstate is not ready: %s", readiness.detail)
    body = {
        "ready": readiness.ready,
        "checks": {
            "database": readiness.database,
            "migrations": {"status": readiness.migrations, "pending": readiness.pending},
        },
    }
    return JsonResponse(body, status=200 if readiness.ready else 503)


@never_cache
@require_safe
@observability_access
def metrics(request: HttpRequest) -> HttpResponse:
    """The operational metrics in the Prometheus text format; 503 when the database
    cannot be read, so the scrape shows as failed rather than as zeros."""
    store = get_state_store()
    using = getattr(store, "using", None)
    # A misconfigured connection raises no DatabaseError (see connection_problem).
    problem = None if using is None else connection_problem(using)
    if problem is not None:
        logger.error("jobstate metrics: cannot connect to database %r: %s", using, problem)
        return _unavailable()
    try:
        payload = render_metrics(store)
    except DatabaseError:
        return _unavailable()
    return HttpResponse(payload, content_type=CONTENT_TYPE)


def _unavailable() -> HttpResponse:
    return HttpResponse(
        "database unavailable\n", status=503, content_type="text/plain; charset=utf-8"
    )
