"""What a response (or a rate-limit error) says about the provider's limits: OpenAI's and
Anthropic's ``x-ratelimit-*`` / ``anthropic-ratelimit-*`` headers, ``retry-after(-ms)``,
with or without litellm's ``llm_provider-`` prefix."""

from __future__ import annotations

import functools
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass
class Reading:
    """What one response's headers say about a limit."""

    limit: float | None = None
    remaining: float | None = None
    reset_s: float | None = None
    # The limit's window, when its spelling says (Anthropic's are per minute): its rate
    # is then the limit over it. Else the window is unknown (OpenAI's may be a day).
    window_s: float | None = None

    @property
    def rate(self) -> float | None:
        """Refill per second: what was used, over the time until it is full again (or
        the limit over its window, when known: Anthropic's resets are whole seconds,
        which made a second's deficit read as 0.7-2x its rate).

        ``remaining`` is rounded down by providers, hence the half unit; a nearly
        full bucket says too little to learn from (one unit of rounding would be a
        large error), and is not when pacing matters anyway."""
        if self.limit is None or self.remaining is None:
            return None
        deficit = self.limit - self.remaining
        if deficit < max(2.0, min(20.0, self.limit / 2)):
            return None
        if self.window_s:
            return self.limit / self.window_s
        if not self.reset_s:
            return None
        return (deficit - 0.5) / self.reset_s


@dataclass
class Headers:
    requests: Reading
    tokens: Reading
    retry_after_s: float | None
    retry_after_exact: bool = False  # from ``retry-after-ms``, not whole seconds

    @property
    def any_limits(self) -> bool:
        return any(
            v is not None for r in (self.requests, self.tokens) for v in (r.limit, r.remaining)
        )


_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ms|h|m|s)")
_UNIT_S = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 0.001}


def parse_duration(text: str | None) -> float | None:
    """Seconds from '1s', '6m0s', '120ms', '0.5' (OpenAI) or an RFC 3339 time
    (Anthropic's ``*-reset``); None when it is neither."""
    if text is None:
        return None
    text = str(text).strip()
    span = _parse_span(text)
    if span is not None:
        return span
    try:
        from datetime import datetime, timezone

        moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
        return max(0.0, (moment - datetime.now(timezone.utc)).total_seconds())
    except ValueError:
        return None


@functools.lru_cache(maxsize=256)
def _parse_span(text: str) -> float | None:
    """'1s', '6m0s', '120ms' or '0.5' in seconds (None: not a span). Cached: a server
    repeats the same few resets, and every answer's are read; a time (RFC 3339) is not
    cached here, its seconds from now change."""
    try:
        return max(0.0, float(text))
    except ValueError:
        pass
    parts = _DURATION.findall(text)
    if parts and "".join(n + u for n, u in parts) == text:
        return sum(float(n) * _UNIT_S[u] for n, u in parts)
    return None


def non_negative(value: Any) -> float | None:
    """A header's number, or None when it is missing, not a number, NaN or negative."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if number >= 0 else None  # (NaN >= 0 is False)


@functools.lru_cache(maxsize=64)
def _rate_limit_names(names: tuple[str, ...]) -> tuple[tuple[str, str], ...]:
    """The names among a response's headers that speak of rate limits: each as sent,
    and as we spell it (lowercase, without litellm's ``llm_provider-`` prefix)."""
    spelled = []
    for name in names:
        ours = str(name).lower().removeprefix("llm_provider-")
        if "rate" in ours or "retry" in ours:
            spelled.append((name, ours))
    return tuple(spelled)


def read_headers(headers: Mapping[str, Any] | None) -> Headers:
    """The rate-limit facts in a response's headers, in OpenAI's or Anthropic's
    spelling, with or without litellm's ``llm_provider-`` prefix."""
    if not headers:
        return Headers(Reading(), Reading(), None)
    # Every answer passes here: its header names are looked up as a whole, and a
    # provider sends the same names with every answer (most none about rate limits).
    spelled = _rate_limit_names(tuple(headers))
    if not spelled:
        return Headers(Reading(), Reading(), None)
    found = {ours: headers[sent] for sent, ours in spelled}
    get = found.get

    def reading(kind: str, anthropic: str) -> Reading:
        limit = get(f"x-ratelimit-limit-{kind}")
        if limit is None and f"anthropic-ratelimit-{anthropic}-limit" in found:
            # Anthropic's: per minute, refilled continuously (its rate limits guide)
            limit = get(f"anthropic-ratelimit-{anthropic}-limit")
            remaining = get(f"anthropic-ratelimit-{anthropic}-remaining")
            reset = get(f"anthropic-ratelimit-{anthropic}-reset")
            window = 60.0
        else:
            remaining = get(f"x-ratelimit-remaining-{kind}")
            reset = get(f"x-ratelimit-reset-{kind}")
            window = None
        return Reading(non_negative(limit), non_negative(remaining), parse_duration(reset), window)

    retry_after = None
    if "retry-after-ms" in found:
        ms = non_negative(found["retry-after-ms"])
        retry_after = ms / 1000 if ms is not None else None
    if retry_after is None and "retry-after" in found:
        retry_after = parse_duration(found["retry-after"])
        if retry_after is None:  # an HTTP date
            from email.utils import parsedate_to_datetime

            try:
                retry_after = max(
                    0.0, parsedate_to_datetime(found["retry-after"]).timestamp() - time.time()
                )
            except (TypeError, ValueError):
                retry_after = None
    return Headers(
        reading("requests", "requests"),
        reading("tokens", "input-tokens"),
        retry_after,
        "retry-after-ms" in found and retry_after is not None,
    )


# OpenAI's refusal says what the request counted: "... on tokens per min (TPM): Limit
# 30000, Used 27000, Requested 4000. Please try again in 2s." (Anthropic's and Azure's
# sentences name the limit only.)
_REQUESTED_TOKENS = re.compile(r"on tokens per \w+ \(\w+\): [^.]*?\bRequested (\d+)")


def requested_tokens(message: str | None) -> int | None:
    """The tokens a refused request counted against a token limit, as OpenAI's 429
    message says them; None when it does not. (OpenAI counts the prompt and
    ``max_tokens``: an upper bound on the prompt's count.)"""
    found = _REQUESTED_TOKENS.search(message) if message else None
    return int(found.group(1)) if found else None


def is_rate_limit(exc: BaseException) -> bool:
    """An HTTP 429, or a provider's rate-limit error as litellm maps it."""
    return getattr(exc, "status_code", None) == 429 or type(exc).__name__ == "RateLimitError"


def headers_of(exc: BaseException) -> Mapping[str, Any] | None:
    """The response headers a litellm error carries, if any."""
    headers = getattr(exc, "litellm_response_headers", None)
    if headers is None:
        headers = getattr(getattr(exc, "response", None), "headers", None)
    return headers
