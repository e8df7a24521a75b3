"""A call's first and last stop at the response cache (``RLM.cache``): an identical
request answered before is answered from the disk, free, and recorded as cached; an
answer is kept unless it was broken off, or cut at a ``max_tokens`` other than its
key's (a hit then says cut_off, as the original did)."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from . import cache as response_cache
from .answer_limit import answer_limit
from .completion import Completion
from .messages import Messages
from .usage import CallRecord

if TYPE_CHECKING:
    from .cache import ResponseCache
    from .call import Call


def answered(call: Call, cache: ResponseCache, messages: Messages) -> Completion | None:
    """The cached answer to ``call``, recorded in its ledger, or None (then the call
    knows its key, for ``keep``)."""
    call.cache = cache
    call.key = call.identity.cache_key(messages, call.options.response_format)
    hit = response_cache.safely(cache.get, call.key)
    if hit is None:
        return None
    elapsed = time.perf_counter() - call.started
    completion = Completion(
        hit["text"],
        call.model,
        hit["input_tokens"],
        hit["output_tokens"],
        cost_usd=0.0,
        cached=True,
        elapsed_s=elapsed,
        finish_reason=hit.get("finish_reason"),
    )
    call.ledger.record(
        CallRecord(
            call.model,
            completion.input_tokens,
            completion.output_tokens,
            0.0,
            cached=True,
            elapsed_s=elapsed,
        )
    )
    return completion


def keep(call: Call, completion: Completion) -> None:
    """Keep ``completion`` under the call's key, if it may be kept."""
    if (
        call.cache is not None
        and call.key is not None
        and completion.cut_reason is None
        and (
            not completion.cut_off
            or answer_limit(call.params) == answer_limit(call.identity.params())
        )
    ):
        response_cache.safely(
            call.cache.set,
            call.key,
            {
                "text": completion.text,
                "input_tokens": completion.input_tokens,
                "output_tokens": completion.output_tokens,
                "finish_reason": completion.finish_reason,
            },
        )
