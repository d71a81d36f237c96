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


def _nested(levels: int, kind: type) -> Any:
    value: Any = 1
    for _ in range(levels):
        value = [value] if kind is list else {"k": value}
    return value


@pytest.mark.parametrize("kind", [list, dict])
def test_a_value_31_levels_deep_is_kept_and_32_refused(kind: type) -> None:
    # MariaDB's JSON check refuses 32 levels of lists or objects: the write would fail
    # inside the database, so every database refuses it here, by name.
    deepest = _nested(31, kind)
    assert ensure_json(deepest, field="result") is deepest
    with pytest.raises(InvalidPayload) as refused:
        ensure_json(_nested(32, kind), field="result")
    assert str(refused.value) == (
        "result is nested more than 31 levels deep (lists and objects): jobstate stores at "
        "most that many on every database, MariaDB's limit."
    )


def test_many_brackets_side_by_side_are_not_depth() -> None:
    wide = {"rows": [[n] for n in range(100)], "text": "[" * 100}
    assert ensure_json(wide, field="input") is wide


@pytest.mark.parametrize(
    ("value", "says"),
    [
        ((1, 2), "it is a tuple, which comes back as a list"),
        ({"a": [1, (2, 3)]}, "its item ['a'][1] is a tuple, which comes back as a list"),
        ({1: "x"}, "it has the key 1 (int), which comes back as a string"),
        ([0, {"k": {2: 3}}], "its item [1]['k'] has the key 2 (int), which comes back as a string"),
    ],
)
def test_a_value_json_changes_is_refused_naming_the_part_that_changes(
    value: object, says: str
) -> None:
    """The message listed what might be wrong ("tuples, non-string keys or other
    values"), even for a value with no tuple in it, and never said where."""
    with pytest.raises(InvalidPayload) as caught:
        ensure_json(value, field="input")
    assert str(caught.value) == (f"input does not survive a JSON round trip unchanged: {says}.")


def test_a_lone_surrogate_is_refused_naming_it_not_a_position_in_the_stored_text() -> None:
    """The message named the codec's position in the stored JSON ("position 11" for a
    one-character argument), which the user never sees. Found by a newcomer's pass."""
    with pytest.raises(InvalidPayload) as caught:
        ensure_json({"args": ["ok", "\ud800"]}, field="input")
    message = str(caught.value)
    assert message == (
        "input contains text that is not valid Unicode: a lone surrogate ('\\ud800'), "
        "which no database can store."
    )
