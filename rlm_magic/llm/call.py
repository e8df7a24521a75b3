"""One call as it goes through the client's stages: how it is asked (``CallOptions``),
how far it got (``Call``), what its cut-off attempts were billed (``Spent``), and how it
is recorded when it fails, as one line in its ledger."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..errors import LLMQueryError
from . import retries
from .completion import INTERRUPTED, Completion
from .identity import RequestIdentity
from .messages import Messages
from .pricing import cache_saving
from .redaction import Redactor, redact_causes, redact_failure
from .streaming import OnText, StreamState
from .transports.base import Answer, Transport
from .usage import CallRecord, UsageLedger

if TYPE_CHECKING:
    from .budget import Reservation
    from .cache import ResponseCache
    from .ratelimit import RateGate


@dataclass(frozen=True, slots=True)
class CallOptions:
    """How one call is made, beyond the request itself.

    - ``stream``: stream the answer (if ``RLM.stream`` and the provider can); the
      timeout then applies to a stall, not to the whole answer.
    - ``on_text``: called on the loop with each piece of streamed text; keep it cheap.
    - ``deadline``: ``time.monotonic()`` by which the call must have ended, retries
      included (a REPL step's deadline): timeouts and retries shrink to fit.
    - ``cache_prefix``: mark the conversation's stable prefix for the provider's prompt
      cache (when ``RLM.prompt_caching`` and the provider needs markers).
    - ``may_retry``: asked before a failed attempt starts over; False when starting over
      would be wrong (a root turn whose code already ran while it streamed).
    - ``response_format``: the provider's structured-output or JSON mode for this call.
    """

    stream: bool = False
    on_text: OnText | None = None
    deadline: float | None = None
    cache_prefix: bool = False
    may_retry: Callable[[], bool] | None = None
    # Sent as is; answers are checked by structured.py.
    response_format: dict[str, Any] | None = None

    def time_left(self, timeout: float) -> float:
        if self.deadline is None:
            return timeout
        return max(0.01, min(timeout, self.deadline - time.monotonic()))


@dataclass(eq=False, slots=True)  # (one per call: slots are lighter, for the collector too)
class Call:
    """One call as it goes through the stages: what it asks, and how far it got."""

    identity: RequestIdentity
    ledger: UsageLedger
    options: CallOptions
    redactor: Redactor | None
    started: float = 0.0  # once it holds a slot of the concurrency limit (perf_counter)
    params: dict[str, Any] = field(init=False)
    # 1. cache
    cache: ResponseCache | None = None
    key: str | None = None
    # 2. prepare
    litellm: Any = None
    messages: Messages = field(default_factory=list)  # redacted, as the model reads them
    marked: Messages = field(default_factory=list)  # ... with prompt-cache markers, if any
    characters: int = 0
    streaming: bool = False
    request: dict[str, Any] = field(default_factory=dict)
    retries_allowed: int = 0
    attempt_timeout: float = 0.0
    transport: Transport = field(init=False)
    gate: RateGate = field(init=False)
    endpoint: str | None = None
    # 3. send
    state: StreamState | None = None  # the current streamed attempt's
    retries: int = 0
    resent: int = 0  # sent again through a Router without spending a retry
    rate_limited: int = 0  # 429s waited out
    limited_since: float | None = None  # when this call first met a rate limit
    cut_reason: str | None = None
    spent: Spent = field(default_factory=lambda: Spent())
    # What it holds in its cost budgets until its record lands (see ``budget``).
    reservation: Reservation | None = None

    def __post_init__(self) -> None:
        self.params = self.identity.params(self.options.response_format)

    @property
    def model(self) -> str:
        return self.identity.model

    # -- how a call ends when it fails -------------------------------------------------
    def failed(self, failure: BaseException, redactor: Redactor) -> LLMQueryError:
        """The call failed for good: record it (with any tokens already billed)."""
        if isinstance(failure, LLMQueryError):  # already its own line (a key's)
            error, cause = failure, failure.cause
            underlying = cause if isinstance(cause, BaseException) else failure
        else:
            # Redacted before its message is made: the message cuts a long error text,
            # and a secret cut in two would be found by neither half.
            redact_causes(failure, redactor)
            error = LLMQueryError(
                self.model, explain_proxy_failure(failure, self.model), retries=self.retries
            )
            underlying = failure
        error = redact_failure(error, underlying, redactor)
        self.record_failure(str(error))
        return error

    def rate_limited_too_long(
        self, why: str, rate_limit_wait: float, redactor: Redactor
    ) -> LLMQueryError:
        waited = time.monotonic() - (self.limited_since or time.monotonic())
        return self.failed(
            RuntimeError(
                f"rate limited for {waited:.0f}s ({self.rate_limited} rate-limited responses), "
                f"past RLM.rate_limit_wait={rate_limit_wait:g}s; {why}"
            ),
            redactor,
        )

    def out_of_time(self, when: str) -> LLMQueryError:
        """The step's deadline came before the call could be sent, or finish."""
        error = LLMQueryError(
            self.model,
            TimeoutError(f"the REPL step's time ran out {when} (step_timeout)"),
            retries=self.retries,
        )
        self.record_failure(str(error))
        return error

    # -- how a call ends when it answers -----------------------------------------------
    def completed(self, answer: Answer) -> Completion:
        """The call's answer as its caller gets it."""
        return Completion(
            answer.text,
            self.model,
            answer.input_tokens,
            answer.output_tokens,
            cost_usd=answer.cost_usd,
            retries=self.retries,
            elapsed_s=time.perf_counter() - self.started,
            cached_input_tokens=answer.cached_input_tokens,
            cache_write_tokens=answer.cache_write_tokens,
            streamed=self.streaming,
            # Broken off: whatever the last chunk said, it is not where the model ended
            # (its text is then a marked ``CutAnswer``).
            finish_reason=answer.finish_reason if self.cut_reason is None else None,
            cut_reason=self.cut_reason,
        )

    def record_answer(self, completion: Completion) -> None:
        """Its line in the ledger (with what its cut-off attempts were billed); what it
        cost lands in its budgets, and the rest of its hold goes back."""
        self.ledger.record(
            record := self.spent.record(
                self.model,
                completion.input_tokens,
                completion.output_tokens,
                completion.cost_usd,
                retries=self.retries,
                rate_limited=self.rate_limited,
                elapsed_s=completion.elapsed_s,
                cached_input_tokens=completion.cached_input_tokens,
                cache_write_tokens=completion.cache_write_tokens,
                cache_saved_usd=cache_saving(
                    self.litellm,
                    self.model,
                    completion.cached_input_tokens,
                    completion.cache_write_tokens,
                ),
                cut_off=completion.incomplete,
            )
        )
        if self.reservation is not None:  # (a reported cost prices an unpriced model)
            self.reservation.landed(record)
        self.release()

    def interrupted(self, partial: Answer) -> Completion:
        """The answer an interrupt cut off, as far as it came (already recorded, by
        ``cancelled``, with what it cost)."""
        return Completion(
            partial.text,
            self.model,
            self.spent.input_tokens,
            self.spent.output_tokens,
            cost_usd=self.spent.cost_usd,
            retries=self.retries,
            elapsed_s=time.perf_counter() - self.started,
            streamed=True,
            cut_reason=INTERRUPTED,
        )

    def cancelled(self) -> None:
        # A cancelled call may already have been billed in part: it stays in the ledger,
        # with the tokens it had streamed.
        self.record_failure("cancelled")

    def record_failure(self, error: str) -> None:
        self.ledger.record(
            self.spent.record(
                self.model,
                retries=self.retries,
                error=error,
                rate_limited=self.rate_limited,
                elapsed_s=time.perf_counter() - self.started,
            )
        )
        self.release()

    def release(self) -> None:
        """Its cost is recorded (or it never went): give back what it held."""
        if self.reservation is not None:
            self.reservation.release()

    def explained(self, failure: BaseException) -> BaseException:
        """A timeout as one line saying which limit was hit (see ``retries.explained``)."""
        return retries.explained(failure, self.attempt_timeout, self.options.deadline, self.state)


class Spent:
    """Tokens and dollars of attempts that were cut off after the provider had started
    answering: they are billed, so they go into the call's record."""

    __slots__ = ("input_tokens", "output_tokens", "cost_usd")

    def __init__(self) -> None:
        self.input_tokens = self.output_tokens = 0
        self.cost_usd: float | None = None

    def add(self, answer: Answer | None) -> None:
        """The tokens of a cut-off attempt's ``answer`` (None: nothing arrived)."""
        if answer is None:
            return
        self.input_tokens += answer.input_tokens
        self.output_tokens += answer.output_tokens
        cost = answer.cost_usd
        if cost is not None:
            self.cost_usd = (self.cost_usd or 0.0) + cost

    def record(
        self,
        model: str,
        input_tokens: int = 0,
        output_tokens: int = 0,
        cost_usd: float | None = None,
        **fields: Any,
    ) -> CallRecord:
        if self.cost_usd is not None:
            cost_usd = (cost_usd or 0.0) + self.cost_usd
        return CallRecord(
            model,
            input_tokens + self.input_tokens,
            output_tokens + self.output_tokens,
            cost_usd,
            **fields,
        )


def explain_proxy_failure(failure: BaseException, model: str) -> BaseException | str:
    """A LiteLLM Proxy without a database answers an unknown key with a 400 "No connected
    db." (it would look the key up there): say what that means."""
    if model.startswith("litellm_proxy/") and "No connected db" in str(failure):
        return (
            "the LiteLLM Proxy rejected the API key: it is not the proxy's master "
            "key, and the proxy has no database to look other keys up in"
        )
    return failure
