"""Keeping secrets out of everything sent to a model.

Values of environment variables whose names look secret (KEY, TOKEN, SECRET,
PASSWORD, ...) and the configured ``api_key`` are replaced by ``[REDACTED]``.
"""

from __future__ import annotations

import asyncio
import functools
import json
import re
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

from .._secrets import MIN_SECRET_LENGTH, environment_secrets

T = TypeVar("T")
E = TypeVar("E", bound=BaseException)

REDACTED = "[REDACTED]"
# Above this many characters, redaction runs in a thread so the loop keeps turning.
OFF_LOOP_CHARS = 256_000


async def off_loop_if_large(size: int, redact: Callable[..., T], *args: Any) -> T:
    """Run ``redact(*args)`` here, or in a thread when it has ``size`` > OFF_LOOP_CHARS
    characters to scan."""
    if size > OFF_LOOP_CHARS:
        return await asyncio.to_thread(redact, *args)
    return redact(*args)


@functools.lru_cache(maxsize=16)
def _pattern(secrets: frozenset[str]) -> re.Pattern[str] | None:
    if not secrets:
        return None
    # Longest first, so a secret that contains another is removed whole.
    return re.compile("|".join(re.escape(s) for s in sorted(secrets, key=len, reverse=True)))


def _spellings(secret: str) -> set[str]:
    """A secret as it may appear in output: as is, and escaped by repr() or JSON (a
    quote, backslash or non-ASCII character changes how it is printed)."""
    return {
        secret,
        repr(secret)[1:-1],
        json.dumps(secret)[1:-1],
        json.dumps(secret, ensure_ascii=False)[1:-1],
    }


class Redactor:
    """Callable that removes the current secrets from a text."""

    def __init__(self, extra: Iterable[str | None] = ()):
        secrets = set(environment_secrets())
        secrets.update(s for s in extra if s and len(s) >= MIN_SECRET_LENGTH)
        spellings = set().union(*map(_spellings, secrets)) if secrets else set()
        self._pattern = _pattern(frozenset(spellings))
        self.longest = max(map(len, spellings), default=0)

    def __call__(self, text: str) -> str:
        if self._pattern is None or not text:
            return text
        return self._pattern.sub(REDACTED, text)

    def head(self, text: str, limit: int) -> str:
        """The first ``limit`` characters of ``text``, redacted. A secret that starts
        before the cut is removed whole; nothing from beyond the cut moves in."""
        if self._pattern is None:
            return text[:limit]
        window = text[: limit + self.longest]
        parts, position = [], 0
        for match in self._pattern.finditer(window):
            if match.start() >= limit:
                break
            parts += [window[position : match.start()], REDACTED]
            position = match.end()
        if position < limit:
            parts.append(window[position:limit])
        return "".join(parts)

    def __bool__(self) -> bool:
        return self._pattern is not None


def redact_conversation(messages: list[dict[str, Any]], redactor: Redactor) -> list[dict[str, Any]]:
    """Every message as it may be sent: with secrets removed. The last line of defence:
    whatever code built the prompt, no environment secret reaches a provider."""
    if not redactor:
        return messages
    return [
        {**m, "content": redactor(m["content"])} if isinstance(m.get("content"), str) else m
        for m in messages
    ]


async def redact_messages(
    messages: list[dict[str, Any]], redactor: Redactor
) -> list[dict[str, Any]]:
    """``redact_conversation``, in a thread when the messages are large."""
    if not redactor:
        return messages
    size = sum(len(m.get("content") or "") for m in messages if isinstance(m.get("content"), str))
    return await off_loop_if_large(size, redact_conversation, messages, redactor)


def redact_failure(error: E, failure: BaseException, redactor: Redactor) -> E:
    """A provider's error text may echo the request (a 401 quoting "Bearer sk-..."): the
    message of ``error`` (raised, recorded and shown to the model's code) and the
    provider's exceptions under it (a traceback shows them) are redacted in place, as
    far as they let us."""
    message = redactor(str(error))
    if message == str(error):
        return error
    error.args = (message,)
    seen: set[int] = set()
    cause: object = failure
    while isinstance(cause, BaseException) and id(cause) not in seen:
        seen.add(id(cause))
        try:
            if isinstance(getattr(cause, "message", None), str):
                cause.message = redactor(cause.message)  # type: ignore[attr-defined]
            cause.args = tuple(redactor(a) if isinstance(a, str) else a for a in cause.args)
        except (AttributeError, TypeError):  # a read-only attribute: left as it is
            pass
        cause = cause.__cause__ or cause.__context__
    return error
