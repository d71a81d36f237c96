"""A module that fails at import with an exception whose message cannot be printed: its
``__str__`` raises, as a host's own exception class can."""


class Unprintable(Exception):
    def __str__(self) -> str:
        raise ValueError("no text for this one")


raise Unprintable
