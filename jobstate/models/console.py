"""Entries of the console that are pages rather than tables: the Overview page, as
a proxy of the jobs table, so the admin lists it with the app's models (on the site's
index, the app's page and the navigation sidebar). No table of its own."""

from __future__ import annotations

from django.utils.translation import gettext_lazy as _

from jobstate.models.jobs import Job


class Overview(Job):
    """The admin's entry for the Overview page (``admin:jobstate_dashboard``); its
    list URL leads there. Who may view jobs may view it."""

    class Meta:
        proxy = True
        verbose_name = _("overview")
        verbose_name_plural = _("overview")
        default_permissions = ()
