"""What a response (or a rate-limit error) says about the provider's limits: OpenAI's and
Anthropic's ``x-ratelimit-*`` / ``anthropic-ratelimit-*`` headers, ``retry-after(-ms)``,
with or without litellm's ``llm_provider-`` prefix."""

from __future__ import annotations

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

    @property
    def rate(self) -> float | None:
        """Refill per second: what was used, over the time until it is full again.

        ``remaining`` is rounded down by providers, hence the half unit; a nearly
        full bucket says too little to learn from (one unit of rounding would be a
        large error), and is not when pacing matters anyway."""
        if self.limit is None or self.remaining is None or not self.reset_s:
            return None
        deficit = self.limit - self.remaining
        if deficit < max(2.0, min(20.0, self.limit / 2)):
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
    try:
        return max(0.0, float(text))
    except ValueError:
        pass
    parts = _DURATION.findall(text)
    if parts and "".join(n + u for n, u in parts) == text:
        return sum(float(n) * _UNIT_S[u] for n, u in parts)
    try:
        from datetime import datetime, timezone

        moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
        return max(0.0, (moment - datetime.now(timezone.utc)).total_seconds())
    except ValueError:
        return None


def non_negative(value: Any) -> float | None:
    """A header's number, or None when it is missing, not a number, NaN or negative."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if number >= 0 else None  # (NaN >= 0 is False)


def read_headers(headers: Mapping[str, Any] | None) -> Headers:
    """The rate-limit facts in a response's headers, in OpenAI's or Anthropic's
    spelling, with or without litellm's ``llm_provider-`` prefix."""
    found: dict[str, Any] = {}
    for key, value in (headers or {}).items():
        key = str(key).lower()
        if "rate" in key or "retry" in key:  # (every answer passes here: skip the rest)
            found[key.removeprefix("llm_provider-")] = value
    if not found:
        return Headers(Reading(), Reading(), None)

    def reading(kind: str, anthropic: str) -> Reading:
        get = found.get

        def either(field: str) -> Any:
            return get(
                f"x-ratelimit-{field}-{kind}", get(f"anthropic-ratelimit-{anthropic}-{field}")
            )

        return Reading(
            non_negative(either("limit")),
            non_negative(either("remaining")),
            parse_duration(either("reset")),
        )

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


def is_rate_limit(exc: BaseException) -> bool:
    """An HTTP 429, or a provider's rate-limit error as litellm maps it."""
    return getattr(exc, "status_code", None) == 429 or type(exc).__name__ == "RateLimitError"


def headers_of(exc: BaseException) -> Mapping[str, Any] | None:
    """The response headers a litellm error carries, if any."""
    headers = getattr(exc, "litellm_response_headers", None)
    if headers is None:
        headers = getattr(getattr(exc, "response", None), "headers", None)
    return headers
