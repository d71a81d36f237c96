"""``jobstate_settings``: a read setting is kept as a plain attribute (the hot paths read
theirs without a call), and a change of ``settings.JOBSTATE`` drops what was kept."""

from __future__ import annotations

from typing import Any

from jobstate.core.conf import jobstate_settings


def test_a_setting_read_before_a_change_reads_the_new_value(settings: Any) -> None:
    settings.JOBSTATE = {**getattr(settings, "JOBSTATE", {}), "MAX_PAYLOAD_BYTES": 123}
    assert jobstate_settings.MAX_PAYLOAD_BYTES == 123
    assert vars(jobstate_settings)["MAX_PAYLOAD_BYTES"] == 123
    settings.JOBSTATE = {**settings.JOBSTATE, "MAX_PAYLOAD_BYTES": 456}
    assert jobstate_settings.MAX_PAYLOAD_BYTES == 456
