"""What the admin hides: payload members under ``JOBSTATE['ADMIN_REDACTED_KEYS']`` and
the configured secrets, wherever a page would show them.

A :class:`Redactor` is built for one record from the JSON values the record carries
(a job's input, result, report, usage and metadata; a notification's payload; an audit
entry's detail). It hides two things:

- **Members by key.** Every object member whose key is a redacted key (compared
  case-insensitively, at any depth) is shown as :data:`REDACTED`, whatever its value.
- **Values in text.** The values of those members (every string or number under a
  redacted key, of at least :data:`MIN_MASKED_LENGTH` characters), the webhook signing
  key and the observability token are masked wherever they appear in the record's free
  text: error texts, audit titles and summaries, comments, the input preview, and
  strings inside the JSON. A channel or a worker that quotes a secret in an error
  cannot show it through the admin.

Only the display changes; stored values and the stores' answers do not.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from django.core.exceptions import ImproperlyConfigured

from jobstate.core.conf import jobstate_settings
from jobstate.stores.contracts.audit import AUDIT_SUMMARY_SEPARATOR

__all__ = [
    "MIN_MASKED_LENGTH",
    "REDACTED",
    "Redactor",
    "configured_secrets",
    "redacted_keys",
    "redactor",
    "scalar_texts",
]

#: What a hidden value is shown as.
REDACTED = "••••"

#: Values under a redacted key shorter than this are hidden in JSON but not searched for
#: in text: masking every "1" or "ok" in an error text would garble it and hide nothing.
MIN_MASKED_LENGTH = 4


def redacted_keys() -> frozenset[str]:
    """``JOBSTATE['ADMIN_REDACTED_KEYS']``, case-folded. A value that is not a list of
    strings raises :class:`~django.core.exceptions.ImproperlyConfigured`: a typo must not
    turn redaction off silently."""
    keys = jobstate_settings.ADMIN_REDACTED_KEYS
    if not isinstance(keys, list | tuple) or not all(isinstance(key, str) for key in keys):
        raise ImproperlyConfigured(
            f"JOBSTATE['ADMIN_REDACTED_KEYS'] must be a list of strings, got {keys!r}."
        )
    return frozenset(key.casefold() for key in keys)


def configured_secrets() -> Iterator[str]:
    """The secrets of the settings a page must never show: the webhook signing key and
    the observability token."""
    for secret in (jobstate_settings.WEBHOOK_SECRET, jobstate_settings.OBSERVABILITY_TOKEN):
        if isinstance(secret, bytes):
            secret = secret.decode("utf-8", "replace")
        # Masked whatever their length: these are never ordinary words of a text.
        if isinstance(secret, str) and secret:
            yield secret


def scalar_texts(value: Any) -> Iterator[str]:
    """Every string and number in ``value``, at any depth, as text."""
    if isinstance(value, dict):
        for item in value.values():
            yield from scalar_texts(item)
    elif isinstance(value, list):
        for item in value:
            yield from scalar_texts(item)
    elif isinstance(value, str):
        yield value
    elif isinstance(value, int | float) and not isinstance(value, bool):
        yield str(value)


def _under_keys(value: Any, keys: frozenset[str]) -> Iterator[str]:
    """The scalars found under a redacted key anywhere in ``value``."""
    if isinstance(value, dict):
        for key, item in value.items():
            if isinstance(key, str) and key.casefold() in keys:
                yield from scalar_texts(item)
            else:
                yield from _under_keys(item, keys)
    elif isinstance(value, list):
        for item in value:
            yield from _under_keys(item, keys)


def _hidden_values(sources: Iterable[Any], keys: frozenset[str]) -> set[str]:
    """The values to mask in text that ``sources`` hold under redacted keys."""
    return {
        value
        for source in sources
        for value in _under_keys(source, keys)
        if len(value) >= MIN_MASKED_LENGTH
    }


@dataclass(frozen=True)
class Redactor:
    """Hides redacted members and masks hidden values for one record's page."""

    keys: frozenset[str]
    values: tuple[str, ...]
    """Longest first, so a value that contains another is masked whole."""
    pattern: re.Pattern[str] | None
    """Matches any of ``values``; ``None`` when there is nothing to mask."""

    def including(self, *sources: Any) -> Redactor:
        """This redactor, also hiding the values under redacted keys in ``sources``
        (for example the payloads of a job's notifications on the job's page)."""
        return _build(self.keys, _hidden_values(sources, self.keys) | set(self.values))

    def text(self, text: str) -> str:
        """``text`` with every hidden value replaced by :data:`REDACTED`."""
        if not text or self.pattern is None:
            return text
        return self.pattern.sub(REDACTED, text)

    def json(self, value: Any) -> Any:
        """A copy of ``value`` in which every member under a redacted key is
        :data:`REDACTED` and every string has its hidden values masked."""
        if isinstance(value, dict):
            return {
                key: REDACTED
                if isinstance(key, str) and key.casefold() in self.keys
                else self.json(item)
                for key, item in value.items()
            }
        if isinstance(value, list):
            return [self.json(item) for item in value]
        if isinstance(value, str):
            return self.text(value)
        return value

    def summary(self, summary: str, detail: Any) -> str:
        """An audit summary fit to show.

        The store's default summary lists ``detail``'s scalar members as ``key: value``
        pairs; each pair with a redacted key is replaced whole by ``key: ••••``, so a
        value cannot show through even when it contains the pairs' separator (the
        pairs are matched as text: PostgreSQL returns ``detail``'s keys in its own
        order, not the one the summary was built in). A pair cut by the summary's
        length limit is masked too. Then ``key: value`` pairs with a redacted key that
        ``detail`` does not hold are masked, and finally the hidden values."""
        if isinstance(detail, dict):
            for key, value in detail.items():
                if not (isinstance(key, str) and key.casefold() in self.keys):
                    continue
                if not isinstance(value, str | int | float | bool):
                    continue  # the default summary lists scalars only
                pair, shown = f"{key}: {value}", f"{key}: {REDACTED}"
                summary = summary.replace(pair, shown)
                cut = summary.rfind(f"{key}: ")
                if cut >= 0 and summary[cut:] != shown and pair.startswith(summary[cut:]):
                    summary = summary[:cut] + shown
        if self.keys and summary:
            names = "|".join(re.escape(key) for key in sorted(self.keys, key=len, reverse=True))
            separator = re.escape(AUDIT_SUMMARY_SEPARATOR)
            summary = re.sub(
                rf"(?i)(^|{separator})({names}): .*?(?={separator}|$)",
                rf"\1\2: {REDACTED}",
                summary,
                flags=re.MULTILINE,
            )
        return self.text(summary)


def _build(keys: frozenset[str], values: Iterable[str]) -> Redactor:
    ordered = tuple(sorted({value for value in values if value}, key=len, reverse=True))
    pattern = re.compile("|".join(map(re.escape, ordered))) if ordered else None
    return Redactor(keys=keys, values=ordered, pattern=pattern)


def redactor(*sources: Any) -> Redactor:
    """The redactor of a record whose JSON values are ``sources``: the redacted keys of
    the setting; hidden values are those under a redacted key in ``sources`` (at least
    :data:`MIN_MASKED_LENGTH` characters) and the configured secrets."""
    keys = redacted_keys()
    return _build(keys, _hidden_values(sources, keys) | set(configured_secrets()))
