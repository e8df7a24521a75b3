"""Keeping secrets out of everything sent to a model.

Values of environment variables whose names look secret (KEY, TOKEN, SECRET,
PASSWORD, ...) and the configured ``api_key`` are replaced by ``[REDACTED]``.
"""

from __future__ import annotations

import functools
import os
import re
from typing import Iterable

from .config import looks_secret

REDACTED = "[REDACTED]"
# Shorter values ("1", "true") would blank out ordinary text and are not real secrets.
MIN_SECRET_LENGTH = 8


def environment_secrets() -> tuple[str, ...]:
    return tuple(value for name, value in os.environ.items()
                 if looks_secret(name) and len(value) >= MIN_SECRET_LENGTH)


@functools.lru_cache(maxsize=16)
def _pattern(secrets: frozenset[str]) -> re.Pattern | None:
    if not secrets:
        return None
    # Longest first, so a secret that contains another is removed whole.
    return re.compile("|".join(re.escape(s) for s in sorted(secrets, key=len, reverse=True)))


class Redactor:
    """Callable that removes the current secrets from a text."""

    def __init__(self, extra: Iterable[str | None] = ()):
        secrets = set(environment_secrets())
        secrets.update(s for s in extra if s and len(s) >= MIN_SECRET_LENGTH)
        self._pattern = _pattern(frozenset(secrets))
        self.longest = max(map(len, secrets), default=0)

    def __call__(self, text: str) -> str:
        if self._pattern is None or not text:
            return text
        return self._pattern.sub(REDACTED, text)

    def __bool__(self) -> bool:
        return self._pattern is not None
