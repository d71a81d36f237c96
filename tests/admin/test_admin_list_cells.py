"""How the console shortens a task's dotted path for a narrow cell: the end, which says
what the task is, stays; the result never exceeds its room."""

from __future__ import annotations

import pytest

from jobstate.admin.list_cells import cut_path


@pytest.mark.parametrize(
    ("path", "limit", "shown"),
    [
        ("project.billing.reports.build_report", 40, "project.billing.reports.build_report"),
        ("project.billing.reports.build_report", 21, "…reports.build_report"),
        ("project.billing.reports.build_report", 14, "…build_report"),
        ("tests.support.task_functions.add", 21, "…task_functions.add"),
        # A last part longer than the room alone is cut in its middle.
        ("app.a_very_long_task_function_name", 13, "app.a_…n_name"),
        # No room for an ellipsis and an end on each side of it.
        ("add", 2, "ad"),
    ],
)
def test_a_path_keeps_its_last_parts_whole_within_its_room(
    path: str, limit: int, shown: str
) -> None:
    cut = cut_path(path, limit)
    assert cut == shown
    assert len(cut) <= limit
