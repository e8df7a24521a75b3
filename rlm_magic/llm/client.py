"""The async LLM client: every model call in rlm-magic goes through ``LLMClient.complete``.

A call is a short pipeline, one method a stage:

1. **cache**: an identical request answered before is answered from the disk cache
   (``RLM.cache``, ``cached_calls``), free;
2. **prepare** (``_prepare``): secrets are removed from the messages, the prompt is fitted
   to the model's window (or refused before anything is paid), the prompt-cache markers
   are set; **admit** (``budget.admit``): under a cost budget, the most the call can
   cost is held until its record lands, or the call is refused, unsent;
3. **send** (``_send``): through the endpoint's rate gate, by its transport, with
   retries (``failed_attempt``): backoff on failures, waits on 429s, a stream cut off
   keeps its text;
4. **record** (``_record``): the usage ledger, what the usage teaches (characters per
   token, answer lengths), the cache.

The client owns what every call of a session shares: the concurrency limit, the cache
and the ledger. Where calls go, and by which transport, is the endpoint's business
(``endpoints``): litellm's ``acompletion``, a Router's, or the wire transport; always on
the caller's running loop (litellm caches its async HTTP clients per event loop), and
never litellm's blocking ``completion``. A call's own state and how it ends are
``call``'s; the retry rules ``retries``'.
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, Any

from ..errors import BudgetExceededError, ConfigError
from . import (
    admission,
    budget,
    cached_calls,
    gate_entry,
    keys,
    litellm_loader,
    readiness,
    slots,
    window_lookup,
    windows,
)
from . import cache as response_cache
from .answer_limit import answer_limit, with_answer_limit
from .call import Call, CallOptions
from .completion import Completion
from .endpoints import CallPlan, Endpoint, Endpoints
from .failed_attempt import after_failure
from .identity import RequestIdentity
from .kept_redactor import KeptRedactor
from .limiter import ConcurrencyLimiter
from .messages import Messages
from .profiles import PROFILES
from .prompt_cache import mark_prefix, needs_markers
from .ratelimit import RateGate
from .redaction import Redactor, redact_messages
from .streaming import StreamState
from .transports.base import Answer, Transport
from .usage import UsageLedger

if TYPE_CHECKING:
    from ..config import RLMConfig
    from .budget import Reservation
    from .cache import ResponseCache


_timeout = getattr(asyncio, "timeout", None)  # Python 3.11+
_UNASKED: Any = object()


class LLMClient:
    """Sends chat requests, shares one concurrency limit and records usage.

    ``transport``: send every call through this transport instead of the one the
    settings choose (a scripted transport, in tests).
    """

    def __init__(
        self,
        config: RLMConfig,
        ledger: UsageLedger | None = None,
        *,
        transport: Transport | None = None,
    ):
        self.config = config
        self.ledger = ledger if ledger is not None else UsageLedger()
        self.limiter = ConcurrencyLimiter(lambda: config.max_concurrency)
        self.endpoints = Endpoints(config, transport)
        self._cache: ResponseCache | None = None
        self._redactor = KeptRedactor()

    @property
    def endpoint(self) -> Endpoint:
        """Where calls go now (a ``%config`` takes effect on the next call)."""
        return self.endpoints.current()

    @property
    def cache(self) -> ResponseCache | None:
        if not self.config.cache:
            return None
        directory = self.config.cache_dir
        if self._cache is None or self._cache.directory != directory:
            self._cache = response_cache.safely(response_cache.ResponseCache, directory)
        return self._cache

    def identity(
        self,
        model: str | None = None,
        max_tokens: int | None = None,
        answer_format: str | None = None,
    ) -> RequestIdentity:
        """What identifies the answer to a request made with these settings now: the
        key of the response cache, of a map's kept answers and of a batch job."""
        config = self.config
        return RequestIdentity(
            model or config.effective_sub_model,
            self.endpoint.identity,
            max_tokens or config.max_tokens,
            config.litellm_kwargs,
            answer_format,
        )

    def redactor(self) -> Redactor:
        """Removes current secrets; a batch builds one and shares it between its calls
        (kept while the secrets stay the same: ``kept_redactor``)."""
        return self._redactor(self.config)

    def gate(self, model: str | None = None) -> RateGate:
        """The rate gate of ``model`` at this client's endpoint (shared process-wide)."""
        return self.endpoint.gate(model or self.config.effective_sub_model)

    def transport(self, model: str, litellm: Any = None) -> Transport:
        """How calls to ``model`` are sent now (see ``endpoints``)."""
        return self.endpoint.transport(model, litellm or litellm_loader.loaded_litellm())

    async def litellm_for(self, *models: str) -> Any:
        """litellm, imported (off the loop) unless every one of ``models`` goes without
        it (``Endpoint.light``): then None, and nothing imports it."""
        return await readiness.litellm_for(self.endpoint, *models)

    async def look_up_windows(
        self, *models: str, litellm: Any = _UNASKED, sample: str | None = None
    ) -> None:
        """Learn these models' windows from litellm once each, off the loop: for some
        providers that is an HTTP request, which would stall every cell's work. (Models
        that go without litellm read theirs from its bundled price map.) ``litellm``:
        what ``litellm_for`` already said for these models. ``sample``: a sample of the
        text they will read, counted by a local server's own tokenizer where it has one
        (their characters per token, before the first turn)."""
        if litellm is _UNASKED:
            litellm = await self.litellm_for(*models)
        await window_lookup.look_up(self.config, self.endpoint, models, litellm, sample)

    def input_window(self, model: str | None = None, advice: bool = False) -> int | None:
        """Input tokens ``model`` takes, if known (see ``windows.input_window``;
        ``advice``: a guessed window counts too, for planning, never for refusing)."""
        model = model or self.config.effective_sub_model
        return window_lookup.input_window(self.config, self.endpoint, model, advice)

    # -- a call ------------------------------------------------------------------------
    async def complete(
        self,
        messages: Messages,
        *,
        model: str | None = None,
        max_tokens: int | None = None,
        identity: RequestIdentity | None = None,
        ledger: UsageLedger | None = None,
        slot_held: bool = False,
        redactor: Redactor | None = None,
        reservation: Reservation | None = None,
        **options: Any,
    ) -> Completion:
        """One chat completion with retries. Raises ``LLMQueryError`` when it fails
        (``BudgetExceededError`` when a cost budget has no room for it: not sent).

        ``slot_held`` says the caller already holds a limiter slot for this call (the
        batch runner acquires slots itself so it can start tasks as slots free up).
        ``reservation``: what a map already holds for this call in its budgets (a
        released one is spent: the call is admitted afresh). ``identity``: the one a map
        keyed its answers by (instead of ``model`` and ``max_tokens`` under the settings
        now). ``options``: see ``CallOptions``.
        """
        call = Call(
            identity or self.identity(model, max_tokens),
            ledger if ledger is not None else self.ledger,
            CallOptions(**options),
            redactor,
        )
        if reservation is not None and not reservation.released:
            call.reservation = reservation
        litellm_loader.call_started()
        try:
            if slot_held:
                return await self._complete(call, messages)
            async with self.limiter:
                return await self._complete(call, messages)
        finally:
            litellm_loader.call_ended()
            call.release()  # a call refused, or ended before its record: nothing held

    async def reserve_batch(
        self,
        conversations: list[Messages],
        *,
        model: str,
        max_tokens: int,
        ledger: UsageLedger | None = None,
    ) -> tuple[list[Reservation | None], BudgetExceededError | None]:
        """Holds for a map's items in the budgets of ``ledger``, in order, before any is
        sent (see ``budget.admit_batch``): the first ``len(holds)`` items may go."""
        ledger = ledger if ledger is not None else self.ledger
        if not budget.budgets_of(ledger):
            return [None] * len(conversations), None
        litellm = await self.litellm_for(model)  # (None on the wire: it counts without)
        return await admission.reserve_batch(
            ledger,
            litellm,
            self.endpoint,
            conversations,
            model,
            max_tokens,
            self.config.litellm_kwargs,
        )

    async def _complete(self, call: Call, messages: Messages) -> Completion:
        call.started = time.perf_counter()  # its time counts from when it holds a slot
        cache = self.cache
        if cache is not None:  # 1. cache
            hit = cached_calls.answered(call, cache, messages)
            if hit is not None:
                return hit
        await self._prepare(call, messages)
        await admission.admit(call, self.endpoint)
        return self._record(call, await self._send(call))

    # -- 2. prepare --------------------------------------------------------------------
    async def _prepare(self, call: Call, messages: Messages) -> None:
        config, model, endpoint = self.config, call.model, self.endpoint
        plan = await self._plan(call, endpoint)
        litellm = call.litellm
        if call.redactor is None:  # (one with no secrets is falsy, and is still the one)
            call.redactor = self.redactor()
        call.messages = messages = await redact_messages(messages, call.redactor)
        call.characters = sum(
            len(m["content"]) for m in messages if isinstance(m.get("content"), str)
        )
        try:
            # Before anything is sent (a local server's window probe included): a model
            # this endpoint cannot serve, or with no key anywhere, is one line.
            endpoint.check(model)
        except ConfigError as exc:
            raise call.failed(exc, self.redactor()) from None
        await self._fit_window(call, plan, endpoint)
        call.marked = (
            mark_prefix(messages)
            if call.options.cache_prefix and config.prompt_caching and needs_markers(litellm, model)
            else messages
        )
        profile = PROFILES.known_model(model)
        call.streaming = (
            call.options.stream and config.stream and not (profile and profile.cannot_stream)
        )
        call.request = plan.request(model, call.marked, call.params)
        call.retries_allowed, call.attempt_timeout = plan.retries_allowed, plan.attempt_timeout
        assert plan.transport is not None  # (planned with litellm when it needs it)
        call.transport = plan.transport
        call.gate = plan.gate
        call.endpoint = endpoint.identity

    async def _plan(self, call: Call, endpoint: Endpoint) -> CallPlan:
        """The endpoint's plan for the call's model; litellm imported only when the call
        needs it (another provider, a Router...): an OpenAI-compatible endpoint's call
        leaves without the import, near its window and under a budget too (they count
        without it: ``windows``, ``budget``)."""
        model = call.model
        litellm = litellm_loader.loaded_litellm()
        if not readiness.ready(litellm):
            await readiness.ready_without_litellm()
        plan = endpoint.plan(model, litellm)
        if litellm is None and (
            plan.transport is None
            or keys.key_check_needs_litellm(self.config, model)  # (whose key RLM.api_key is)
        ):
            litellm = await litellm_loader.load_litellm()
            plan = endpoint.plan(model, litellm)
        call.litellm = litellm
        return plan

    async def _fit_window(self, call: Call, plan: CallPlan, endpoint: Endpoint) -> None:
        """A prompt the model cannot take is not sent (it would be billed or refused);
        one that fits beside a shorter answer asks for less (``windows.fit_answer``)."""
        config, model = self.config, call.model
        if plan.windows_unsettled:
            await self.look_up_windows(model, litellm=call.litellm)
            plan.windows_unsettled = not window_lookup.settled(config, endpoint, model)
        window = self.input_window(model)
        if window is not None:
            fitted = await windows.fit_answer(
                call.litellm,
                model,
                call.messages,
                window,
                answer_limit(call.params) or call.identity.max_tokens,
                window_lookup.server_count(config, endpoint, model),
            )
            call.params = with_answer_limit(call.params, fitted)

    # -- 3. send -----------------------------------------------------------------------
    async def _send(self, call: Call) -> Answer:
        """Attempts until one answers (or breaks off with text), or the call fails."""
        tokens = call.gate.estimate_tokens(call.characters)
        while True:
            ticket = await gate_entry.enter(
                call, tokens, self.config.rate_limit_wait, self.redactor
            )
            options = call.options
            if call.state is not None and call.state.received and options.on_text is not None:
                options.on_text(None)  # the answer starts over
            call.state = StreamState(options.on_text, call.reservation) if call.streaming else None
            try:
                answer = await self._attempt(call)
            except asyncio.CancelledError as cancel:
                call.gate.failed(ticket)
                partial = call.transport.partial(call.state, call.messages)
                call.spent.add(partial)
                call.cancelled()  # in the ledger as cancelled, with the tokens it had
                if partial is not None:
                    # What arrived rides on the cancellation, marked, to whoever keeps
                    # a batch's answers (``partial_answer``).
                    cancel.partial_answer = call.interrupted(partial)  # type: ignore[attr-defined]
                raise
            except Exception as exc:  # noqa: BLE001 - every failure is decided on below
                failure = exc
            else:
                call.gate.answered(
                    ticket, answer.headers, answer.input_tokens or None, call.characters
                )
                return answer
            partial = call.transport.partial(call.state, call.messages)
            if partial is not None:
                # Cut off after text arrived (a stall, the step's deadline, a server
                # gone): that text is the answer, marked; starting over would throw
                # away what was generated and pay for it again.
                call.gate.failed(ticket)
                call.cut_reason = self.redactor()(str(call.explained(failure)))
                return partial
            call.spent.add(call.transport.partial(call.state, call.messages))
            await after_failure(call, ticket, failure, self.config, self.endpoint, self.redactor)

    async def _attempt(self, call: Call) -> Answer:
        """One request by the transport, streamed (into ``call.state``) or whole; past a
        local server's slots it waits for one first (``slots``), its timers not started."""
        options = call.options
        async with slots.held(call, self.config.api_key):
            if call.state is not None:
                # (A Router's attempt is all its failovers: the stream opens after them.)
                if call.attempt_timeout > self.config.timeout:
                    call.state.open_within = options.time_left(call.attempt_timeout)
                return await call.transport.stream(
                    call.request,
                    call.state,
                    stall_timeout=options.time_left(self.config.timeout),
                    deadline=options.deadline,
                    messages=call.messages,
                )
            seconds = options.time_left(call.attempt_timeout)
            if _timeout is None:  # Python 3.10
                return await asyncio.wait_for(call.transport.complete(call.request), seconds)
            async with _timeout(seconds):  # (wait_for before 3.12 starts a task for each call)
                return await call.transport.complete(call.request)

    # -- 4. record ---------------------------------------------------------------------
    def _record(self, call: Call, answer: Answer) -> Completion:
        completion = call.completed(answer)
        if call.cut_reason is None:
            windows.learn_usage(
                call.model,
                call.messages,
                completion.input_tokens,
                completion.output_tokens,
                completion.finish_reason == "stop",
            )
        call.record_answer(completion)
        cached_calls.keep(call, completion)
        return completion
