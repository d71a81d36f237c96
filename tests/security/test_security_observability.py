"""``/metrics`` and ``/health/ready`` reveal no payloads, and
``JOBSTATE['OBSERVABILITY_TOKEN']`` closes them to anyone without the token."""

from __future__ import annotations

import hmac
from datetime import timedelta
from typing import Any

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.test import Client
from django.utils import timezone

from jobstate.models import Job, Notification
from jobstate.stores.base import NotificationRequest
from jobstate.stores.database import DatabaseStateStore

pytestmark = pytest.mark.django_db

ENDPOINTS = ["/metrics", "/health/ready"]
TOKEN = "obs-token-5f1c9e"
MARKER = "payload-marker-7d3a"


@pytest.fixture
def jobs_everywhere() -> None:
    """Jobs in every status and two notifications, each carrying the marker in its JSON
    (input, metadata, result, payload) and in its texts (input preview, error,
    destination)."""
    store = DatabaseStateStore()
    marked = {"value": MARKER, "nested": [{"deep": MARKER}]}
    fields = {
        "input": marked,
        "metadata": {"note": MARKER},
        "input_preview": MARKER,
        "target": "mail",
    }
    for request_id, status in [("done", "done"), ("failed", "error")]:
        store.create_job(request_id=request_id, **fields)
        claimed = store.claim_next_inhub_job(["mail"], "worker-1")
        assert claimed is not None and claimed.request_id == request_id
        finished = store.complete_job_with_notifications(
            claimed,
            {"status": status, "result": marked, "error": MARKER},
            [NotificationRequest("webhook", f"https://hooks.example/{MARKER}", marked)],
        )
        assert finished is not None
    # A running job whose lease expired, with a queued job waiting behind it on its
    # thread; a queued job and a delayed one.
    store.create_job(request_id="running", thread_id=7, **fields)
    running = store.claim_next_inhub_job(["mail"], "worker-2")
    assert running is not None and running.request_id == "running"
    store.update_job(running.id, lease_until=timezone.now() - timedelta(days=1))
    store.create_job(request_id="waiting-behind", thread_id=7, **fields)
    store.create_job(request_id="queued", thread_id=8, **fields)
    later = timezone.now() + timedelta(hours=1)
    store.create_job(request_id="delayed", thread_id=9, run_after=later, **fields)
    assert Job.objects.filter(input__value=MARKER).count() == 6
    assert Notification.objects.filter(payload__value=MARKER).count() == 2


@pytest.mark.parametrize("path", ENDPOINTS)
def test_the_endpoints_show_no_payload(jobs_everywhere: None, client: Client, path: str) -> None:
    response = client.get(path)
    assert response.status_code == 200
    body = response.content.decode()
    assert MARKER not in body
    if path == "/metrics":
        # The figures are there, so the marker's absence means something.
        assert 'jobstate_jobs{status="done"} 1.0' in body
        assert "jobstate_jobs_expired_leases 1.0" in body
        assert "jobstate_threads_blocked 1.0" in body
        assert "jobstate_queue_delayed_jobs 1.0" in body
    else:
        assert response.json()["ready"] is True


@pytest.mark.parametrize("path", ENDPOINTS)
@pytest.mark.parametrize(
    "authorization",
    [
        None,
        "",
        "Bearer",
        "Bearer ",
        "Bearer wrong-token",
        f"Bearer {TOKEN}x",
        f"Bearer {TOKEN[:-1]}",
        f"Basic {TOKEN}",
        TOKEN,
    ],
)
def test_without_the_token_the_endpoints_say_nothing_and_read_nothing(
    jobs_everywhere: None,
    settings: Any,
    path: str,
    authorization: str | None,
    django_assert_num_queries: Any,
) -> None:
    settings.JOBSTATE = {"OBSERVABILITY_TOKEN": TOKEN}
    headers = {} if authorization is None else {"Authorization": authorization}
    with django_assert_num_queries(0):
        response = Client().get(path, headers=headers)
    assert response.status_code == 401
    assert response["WWW-Authenticate"] == 'Bearer realm="jobstate"'
    assert response.json() == {"detail": "authentication required"}


@pytest.mark.parametrize("path", ENDPOINTS)
@pytest.mark.parametrize("scheme", ["Bearer", "bearer"])
def test_the_right_token_opens_the_endpoints(
    jobs_everywhere: None, settings: Any, path: str, scheme: str
) -> None:
    settings.JOBSTATE = {"OBSERVABILITY_TOKEN": TOKEN}
    response = Client().get(path, headers={"Authorization": f"{scheme} {TOKEN}"})
    assert response.status_code == 200
    assert MARKER not in response.content.decode()


@pytest.mark.parametrize("given", ["wrong", TOKEN[:3], TOKEN, TOKEN + "-and-more"])
def test_the_token_is_compared_in_constant_time_over_equal_lengths(
    settings: Any, monkeypatch: pytest.MonkeyPatch, given: str
) -> None:
    """The comparison goes through ``hmac.compare_digest`` and always on inputs of one
    length, so neither a guess's matching prefix nor its length shows in the timing."""
    settings.JOBSTATE = {"OBSERVABILITY_TOKEN": TOKEN}
    compared: list[tuple[int, int]] = []
    real = hmac.compare_digest

    def recording(a: bytes, b: bytes) -> bool:
        compared.append((len(a), len(b)))
        return real(a, b)

    monkeypatch.setattr(hmac, "compare_digest", recording)
    response = Client().get("/metrics", headers={"Authorization": f"Bearer {given}"})
    assert response.status_code == (200 if given == TOKEN else 401)
    assert len(compared) == 1
    assert compared[0][0] == compared[0][1]


@pytest.mark.parametrize(
    "token", ["", "   ", b"bytes-token", 12345, " s3cret", "s3cret\n", "pässwort", "a\ud800"]
)
def test_a_token_that_cannot_work_is_refused_loudly(settings: Any, token: object) -> None:
    """An empty token must not turn into one anybody can send (``Bearer`` and nothing),
    nor a wrong type into open endpoints. A token no client can send (spaces at an end,
    which HTTP strips; a character a header cannot carry) closed them to everyone, and a
    lone surrogate gave a 500 with a UnicodeEncodeError."""
    settings.JOBSTATE = {"OBSERVABILITY_TOKEN": token}
    for path in ENDPOINTS:
        with pytest.raises(ImproperlyConfigured, match="OBSERVABILITY_TOKEN"):
            Client().get(path, headers={"Authorization": "Bearer "})
        response = Client(raise_request_exception=False).get(
            path, headers={"Authorization": "Bearer "}
        )
        assert response.status_code == 500
