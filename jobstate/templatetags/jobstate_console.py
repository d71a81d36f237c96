"""Tags of the console's own admin pages: breadcrumbs written the way the running
Django admin writes its own (``{% load jobstate_console %}``)."""

from __future__ import annotations

from functools import cache
from pathlib import Path

import django.contrib.admin
from django import template

register = template.Library()

#: How Django's admin opens its breadcrumbs when it writes them as a list (an ``<ol>``
#: of ``<li>``, Django 6.1 on) rather than a ``<div>`` of links and separators.
_LIST_MARKUP = '<ol class="breadcrumbs">'


@cache
def _admin_writes_list() -> bool:
    # Read from the installed admin's own change list, so the console follows the
    # running version's markup (and its stylesheet, written for that markup).
    source = Path(django.contrib.admin.__file__).parent / "templates/admin/change_list.html"
    return _LIST_MARKUP in source.read_text(encoding="utf-8")


@register.simple_tag
def breadcrumbs_as_list() -> bool:
    """Whether the running admin writes breadcrumbs as an ``<ol>`` of ``<li>``."""
    return _admin_writes_list()
