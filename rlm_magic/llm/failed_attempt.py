"""What follows a failed attempt of a call: waited out (a rate limit), sent again at
once without spending a retry (a refused connection behind a Router, cache markers the
provider rejects, a model that cannot stream), retried after a backoff, or the call's
``LLMQueryError``. The rules for what is retryable and how long to wait are
``retries``'; this module applies them to one call, in order."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from ..errors import describe_exception
from . import keys, litellm_loader, retries, windows
from .profiles import PROFILES
from .prompt_cache import refuses_markers
from .ratelimit import Ticket, headers_of, is_rate_limit
from .redaction import Redactor, redact_causes

if TYPE_CHECKING:
    from ..config import RLMConfig
    from .call import Call
    from .endpoints import Endpoint


async def after_failure(
    call: Call,
    ticket: Ticket,
    failure: Exception,
    config: RLMConfig,
    endpoint: Endpoint,
    redactor: Callable[[], Redactor],
) -> None:
    """Decide on a failed attempt: return to try again (at once, or after a backoff),
    or raise the call's ``LLMQueryError``."""
    if is_rate_limit(failure):
        _waited_out(call, ticket, failure, config, redactor)
        return
    call.gate.failed(ticket)
    if call.litellm is None and keys.may_be_key_failure(failure):
        # What the key failure says (which variable, where from) is litellm's to tell.
        call.litellm = await litellm_loader.load_litellm()
    refused = endpoint.key_failure(failure, call.model)
    if refused is not None:  # the same key would be refused again: never retried
        raise call.failed(refused, redactor()) from failure
    windows.learn_from(failure, call.endpoint, call.model, call.messages)
    if await _sent_again_at_once(call, failure, endpoint):
        return
    await _backoff_or_fail(call, failure, config, redactor)


def _waited_out(
    call: Call,
    ticket: Ticket,
    failure: Exception,
    config: RLMConfig,
    redactor: Callable[[], Redactor],
) -> None:
    """A 429: not a failure. The gate holds this call (and every other call to this
    endpoint) back until the provider's limit allows it, then it goes again; past
    ``RLM.rate_limit_wait`` the call fails."""
    # Redacted before anything reads its text: the message made of it is cut, and a key
    # cut in two would be found by neither half.
    redact_causes(failure, redactor())
    call.gate.rate_limited_by(ticket, headers_of(failure), str(failure))
    call.rate_limited += 1
    call.limited_since = call.limited_since or ticket.sent_at
    if time.monotonic() - call.limited_since < config.rate_limit_wait:
        return
    raise call.rate_limited_too_long(
        describe_exception(failure), config.rate_limit_wait, redactor()
    ) from failure


async def _sent_again_at_once(call: Call, failure: Exception, endpoint: Endpoint) -> bool:
    """Whether the call goes again at once, without spending a retry: nothing reached a
    server, or the request changes so that the same failure cannot come again."""
    model = call.model
    if retries.refused_connection(failure):
        deadline = call.options.deadline
        within_time = deadline is None or time.monotonic() + retries.MIN_ATTEMPT_S < deadline
        routed_around = len(endpoint.models_behind(model)) > 1
        if routed_around and call.resent < retries.REFUSED_RESENDS and within_time:
            # A deployment of a Router's group refused the connection: nothing reached
            # a server. Ask the Router again without spending a retry: until refusals
            # put that deployment in its cooldown, the Router's shuffle may pick it for
            # every attempt of a call.
            call.resent += 1
            await asyncio.sleep(0)  # (the Router records the refusal first)
            return True
    if call.marked is not call.messages and refuses_markers(failure):
        # A provider that rejects cache_control markers: send it plain, from now on.
        PROFILES.model(model).refuses_cache_markers = True
        call.marked = call.request["messages"] = call.messages
        return True
    state = call.state
    if call.streaming and state is not None and not state.chunks and not state.received:
        if retries.cannot_stream(failure):
            PROFILES.model(model).cannot_stream = True
            call.streaming = False
            return True
    return False


async def _backoff_or_fail(
    call: Call, failure: Exception, config: RLMConfig, redactor: Callable[[], Redactor]
) -> None:
    """Wait the backoff and return to try again, or raise the call's error: out of
    retries, not retryable, out of time, or refused again as it stands."""
    delay = retries.backoff(call.retries, config.retry_backoff, failure)
    options = call.options
    out_of_time = (
        options.deadline is not None
        and time.monotonic() + delay + retries.MIN_ATTEMPT_S >= options.deadline
    )
    final = options.may_retry is not None and not options.may_retry()
    # A prompt over the window is refused again as it stands: never retried (the
    # refusal taught the window and the estimate instead).
    final = final or windows.is_context_error(failure)
    if (
        call.retries >= call.retries_allowed
        or not retries.is_retryable(failure)
        or out_of_time
        or final
    ):
        explained = call.explained(failure)
        raise call.failed(explained, redactor()) from explained
    call.retries += 1
    try:
        await asyncio.sleep(delay)
    except asyncio.CancelledError:
        call.cancelled()
        raise
