"""Fixtures of the security tests."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client

from tests.support.admin_kit import logged_in
from tests.support.receiver import Receiver
from tests.support.security_kit import jobstate_permissions


@pytest.fixture
def outsiders(django_user_model: Any) -> dict[str, Client]:
    """An anonymous visitor and a signed-in user who is not staff (holding every
    jobstate permission, which must not matter)."""
    member = django_user_model.objects.create_user(username="nina", password=None)
    member.user_permissions.add(*jobstate_permissions())
    return {"anonymous": Client(), "not staff": logged_in(member)}


@pytest.fixture
def receiver(receiver: Receiver) -> Receiver:
    """The shared receiver, with a path that fails and one that redirects away."""
    receiver.routes.update({"/error": 500, "/away": ("redirect", 302, "http://elsewhere.test/")})
    return receiver
