"""``ensure_json``: the JSON scalars most tasks return take a shorter way, under the same
size limit as every other value."""

from __future__ import annotations

from typing import Any

import pytest

from jobstate.core.jsonvalues import ensure_json
from jobstate.exceptions import InvalidPayload


@pytest.mark.parametrize("value", [None, True, False, 0, "", [], {}])
def test_a_small_value_comes_back_as_it_is(value: Any) -> None:
    assert ensure_json(value, field="result") is value


@pytest.mark.parametrize(("value", "size"), [(None, 4), (True, 4), (False, 5), ("abc", 5)])
def test_a_scalar_is_measured_as_its_json(settings: Any, value: Any, size: int) -> None:
    settings.JOBSTATE = {**getattr(settings, "JOBSTATE", {}), "MAX_PAYLOAD_BYTES": size}
    assert ensure_json(value, field="result") is value
    settings.JOBSTATE = {**settings.JOBSTATE, "MAX_PAYLOAD_BYTES": size - 1}
    with pytest.raises(InvalidPayload) as refused:
        ensure_json(value, field="result")
    assert str(refused.value) == (
        f"result is {size} bytes of JSON; the limit is {size - 1} (JOBSTATE['MAX_PAYLOAD_BYTES'])."
    )
