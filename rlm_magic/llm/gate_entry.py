"""A call's entry through its endpoint's rate gate, within the time it has: its own
deadline (a REPL step's), and ``RLM.rate_limit_wait`` once it was rate limited. What the
gate does (pauses, concurrency, pace) is ``ratelimit``'s; this module says what a call
that cannot get through in time ends with."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from ..errors import RateLimitWaitExceeded
from .ratelimit import Ticket
from .redaction import Redactor

if TYPE_CHECKING:
    from .call import Call


async def enter(
    call: Call, tokens: float, rate_limit_wait: float, redactor: Callable[[], Redactor]
) -> Ticket:
    """The gate's ticket for one attempt of ``call`` (``tokens``: its estimate), or the
    call's ``LLMQueryError`` (recorded) when it could not be sent in time."""
    deadline = None if call.limited_since is None else call.limited_since + rate_limit_wait
    step_deadline = call.options.deadline
    if step_deadline is not None:
        deadline = min(deadline or step_deadline, step_deadline)
    try:
        ticket = await call.gate.enter(tokens, deadline)
    except asyncio.CancelledError:
        call.cancelled()
        raise
    except RateLimitWaitExceeded as exc:
        if step_deadline is not None and deadline == step_deadline:
            raise call.out_of_time(
                "before it could be sent"
                if time.monotonic() >= step_deadline
                else "while the provider's rate limit held it back",
            ) from None
        raise call.rate_limited_too_long(
            f"the provider's limit would hold it {exc.args[0]:.0f}s more",
            rate_limit_wait,
            redactor(),
        ) from None
    if step_deadline is not None and time.monotonic() >= step_deadline:
        call.gate.failed(ticket)  # nothing is sent that could not finish in time
        raise call.out_of_time("before it could be sent")
    return ticket
