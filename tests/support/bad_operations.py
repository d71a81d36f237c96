"""An operations module whose declaration is wrong: it raises ``InvalidJobKey`` while it
is imported, as a host's module with a mistyped key does."""

from jobstate.operations import operations_job


@operations_job("ops.<b>bold</b>")
def bold() -> None:
    """Never registered: the key is refused."""
