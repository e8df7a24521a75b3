"""When a failed call is tried again, how long it waits first, and how a final failure
is worded.

408/409, 5xx, timeouts and connection failures are worth another try, after a backoff
that doubles each time, with full jitter (independent retries must not collide again),
and never sooner than the provider's ``retry-after``. Authentication failures, bad
requests and unknown models are not. 429s are not retried here at all: the rate gate
waits them out (``ratelimit``), within ``RLM.rate_limit_wait``.
"""

from __future__ import annotations

import asyncio
import random
import time

from ..errors import StreamStalled, causes
from .streaming import StreamState

# No retry is started with less time than this before the call's deadline.
MIN_ATTEMPT_S = 0.5
# How often a call whose connection a Router's deployment refused is sent again,
# without spending a retry (a refusal costs nothing and takes a millisecond).
REFUSED_RESENDS = 3
# The longest a provider's retry-after is waited for by a retry (not a 429's pause).
MAX_RETRY_AFTER_S = 60.0


def is_retryable(exc: BaseException) -> bool:
    """408/409, 5xx, timeouts and connection failures are worth another try;
    authentication, bad requests and unknown models are not."""
    if isinstance(exc, (asyncio.TimeoutError, TimeoutError, ConnectionError)):
        return True
    status = getattr(exc, "status_code", None)
    if isinstance(status, int):
        return status in (408, 409) or status >= 500
    return type(exc).__name__ in {"APIConnectionError", "Timeout", "APITimeoutError"}


def refused_connection(exc: BaseException) -> bool:
    """The server refused the connection: nothing of the request reached it."""
    return any(isinstance(link, ConnectionRefusedError) for link in causes(exc))


def retry_after(exc: BaseException) -> float | None:
    """The seconds a failed response's ``retry-after`` header asks for, if any."""
    response = getattr(exc, "response", None)
    headers = getattr(response, "headers", None)
    try:
        return float(headers.get("retry-after")) if headers else None
    except (TypeError, ValueError):
        return None


def backoff(retries: int, base_s: float, failure: BaseException) -> float:
    """Seconds before retry number ``retries + 1``: full jitter over a doubling window,
    but at least what the provider asked for."""
    delay = random.uniform(0, base_s * 2**retries)
    return max(delay, min(retry_after(failure) or 0.0, MAX_RETRY_AFTER_S))


def cannot_stream(exc: BaseException) -> bool:
    """A provider that does not stream says so with a 400 (or litellm refuses)."""
    status = getattr(exc, "status_code", None)
    return (
        status in (400, 422) or type(exc).__name__ == "UnsupportedParamsError"
    ) and "stream" in str(exc).lower()


def explained(
    failure: BaseException, timeout: float, deadline: float | None, state: StreamState | None
) -> BaseException:
    """Timeouts as one line that says which limit was hit."""
    if (
        deadline is not None
        and time.monotonic() >= deadline - MIN_ATTEMPT_S
        and isinstance(failure, (asyncio.TimeoutError, TimeoutError))
    ):
        got = f" after {len(state.text):,} characters" if state and state.received else ""
        return TimeoutError(f"the REPL step's time ran out{got} (step_timeout)")
    if isinstance(failure, StreamStalled):
        got = f" after {len(state.text):,} characters" if state and state.received else ""
        return TimeoutError(f"{failure}{got} (timeout={timeout:g}s)")
    if isinstance(failure, asyncio.TimeoutError):
        return TimeoutError(f"no answer within timeout={timeout:g}s")
    if state is not None and state.received and _connection_dropped(failure):
        return ConnectionError(
            f"the server closed the connection after {len(state.text):,} characters, "
            "before the answer's end"
        )
    return failure


# How HTTP clients say that a response's body stopped short (or a stream ended without
# its finish): aiohttp's "Response payload
# is not completed: <TransferEncodingError: 400, ...>" (the 400 is aiohttp's own code,
# not an HTTP status), a cut chunked body, or a connection reset mid-answer.
_DROPPED_KINDS = ("ClientPayloadError", "TransferEncodingError", "ContentLengthError")
_DROPPED_WORDS = (
    "Response payload is not completed",
    "Not enough data to satisfy",
    "Connection reset by peer",
    "Server disconnected",
    "incomplete chunked read",
    "peer closed connection without sending complete message body",
    "Stream ended before a finish_reason was received",  # litellm's, and the wire's
)


def _connection_dropped(failure: BaseException) -> bool:
    return any(
        type(seen).__name__ in _DROPPED_KINDS or any(words in str(seen) for words in _DROPPED_WORDS)
        for seen in causes(failure)
    )
