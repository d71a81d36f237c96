"""Importing the dotted paths a setting or a schedule names: every way a module can fail
is one error with a reason a message can repeat, and a process-ending exit passes."""

from __future__ import annotations

import sys

import pytest

from jobstate.core.imports import NotImportable, import_path


def test_a_path_that_imports_gives_its_object() -> None:
    assert import_path("jobstate.core.imports.import_path") is import_path


def test_a_missing_module_is_not_importable_with_python_s_message() -> None:
    with pytest.raises(NotImportable) as caught:
        import_path("tests.support.no_such_module.Thing")
    assert caught.value.reason == "No module named 'tests.support.no_such_module'"
    assert caught.value.path == "tests.support.no_such_module.Thing"
    assert isinstance(caught.value.__cause__, ImportError)


def test_a_name_the_module_lacks_is_not_importable() -> None:
    with pytest.raises(NotImportable) as caught:
        import_path("jobstate.core.imports.nothing_here")
    assert 'does not define a "nothing_here"' in caught.value.reason


def test_a_module_that_raises_at_import_is_named_with_its_error() -> None:
    with pytest.raises(NotImportable) as caught:
        import_path("tests.support.raises_at_import.anything")
    assert caught.value.reason == "RuntimeError: this module fails at import on purpose"


def test_an_error_whose_message_raises_is_named_by_its_class() -> None:
    with pytest.raises(NotImportable) as caught:
        import_path("tests.support.unprintable_at_import.anything")
    assert caught.value.reason == "Unprintable: Unprintable"
    assert str(caught.value) == (
        "'tests.support.unprintable_at_import.anything' does not import: Unprintable: Unprintable"
    )


def test_a_module_that_exits_at_import_ends_the_process(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delitem(sys.modules, "tests.support.exits_at_import", raising=False)
    with pytest.raises(SystemExit):
        import_path("tests.support.exits_at_import.anything")
