"""The async LLM client: every model call in rlm-magic goes through ``LLMClient.complete``.

A call is a short pipeline, one method a stage:

1. **cache** (``_from_cache``): an identical request answered before is answered from
   the disk cache (``RLM.cache``), free;
2. **prepare** (``_prepare``): secrets are removed from the messages, the prompt is fitted
   to the model's window (or refused before anything is paid), the prompt-cache markers
   are set;
   **admit** (``budget.admit``): under a cost budget, the most the call can cost is held
   until its record lands, or the call is refused, unsent, when that does not fit;
3. **send** (``_send``): through the endpoint's rate gate, by its transport, with
   retries: backoff on failures, waits on 429s, a stream cut off keeps its text;
4. **record** (``_record``): the usage ledger, what the usage teaches (characters per
   token, answer lengths), the cache.

The client owns what every call of a session shares: the concurrency limit, the cache
and the ledger. Where calls go, and by which transport, is the endpoint's business
(``endpoints``): litellm's ``acompletion``, a Router's, or the wire transport; always on
the caller's running loop (litellm caches its async HTTP clients per event loop), and
never litellm's blocking ``completion``.

One concept past 400 lines: the pipeline, each stage a short method, kept together so
that a call can be followed from ``complete`` to its record in one file. A call's own
state and how it ends are ``call``'s; the retry rules ``retries``'.
"""

from __future__ import annotations

import asyncio
import os
import time
from typing import TYPE_CHECKING, Any

from ..errors import (
    BudgetExceededError,
    ConfigError,
    LLMQueryError,
    RateLimitWaitExceeded,
    describe_exception,
)
from . import budget, keys, litellm_loader, local_servers, price_map, retries, slots, windows
from . import cache as response_cache
from .call import Call, CallOptions
from .completion import Completion
from .endpoints import Endpoint, Endpoints
from .identity import RequestIdentity
from .limiter import ConcurrencyLimiter
from .messages import Messages
from .pricing import cache_saving
from .profiles import PROFILES
from .prompt_cache import mark_prefix, needs_markers, refuses_markers
from .ratelimit import RateGate, Ticket, headers_of, is_rate_limit
from .redaction import Redactor, redact_causes, redact_messages
from .streaming import StreamState
from .transports.base import Answer, Transport
from .usage import CallRecord, UsageLedger

if TYPE_CHECKING:
    from ..config import RLMConfig
    from .budget import Reservation
    from .cache import ResponseCache


async def _ready_without_litellm() -> None:
    """Off the loop, once: the price map (whether a price is tiered), aiohttp and the TLS
    context (~0.1 s of imports and certificates the first time)."""
    if _wire_is_ready:
        await price_map.load()  # (read once: nothing to do after)
    else:
        await asyncio.gather(price_map.load(), asyncio.to_thread(_wire_ready))


def _wire_ready() -> None:
    global _wire_is_ready
    import aiohttp  # noqa: F401 - imported here, in a thread, rather than on the loop

    litellm_loader.ssl_context()
    _wire_is_ready = True


_wire_is_ready = False  # once: a thread's hop on every call cost more than the call
_timeout = getattr(asyncio, "timeout", None)  # Python 3.11+
_UNASKED: Any = object()


def _environment_items() -> tuple[Any, ...] | None:
    """The environment as it stands, cheaply compared (os.environ's own dict; None where
    it has none: then nothing built from it is kept)."""
    data = getattr(os.environ, "_data", None)
    return tuple(data.items()) if isinstance(data, dict) else None


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
        self._redactor: tuple[tuple[Any, tuple[str, ...]], Redactor] | None = None

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
        """Removes current secrets; a batch builds one and shares it between its calls.
        Kept while the secrets stay the same: building one reads the whole environment
        (~0.2 ms, more than a call's HTTP exchange)."""
        extra = tuple(self.config.configured_secrets())
        environment = _environment_items()
        kept = self._redactor
        if kept is not None and environment is not None and kept[0] == (environment, extra):
            return kept[1]
        redactor = Redactor(extra=extra)
        self._redactor = ((environment, extra), redactor)
        return redactor

    def gate(self, model: str | None = None) -> RateGate:
        """The rate gate of ``model`` at this client's endpoint (shared process-wide)."""
        return self.endpoint.gate(model or self.config.effective_sub_model)

    def transport(self, model: str, litellm: Any = None) -> Transport:
        """How calls to ``model`` are sent now (see ``endpoints``)."""
        return self.endpoint.transport(model, litellm or litellm_loader.loaded_litellm())

    async def litellm_for(self, *models: str) -> Any:
        """litellm, imported (off the loop) unless every one of ``models`` goes without
        it (``Endpoint.light``): then None, and nothing imports it."""
        litellm = litellm_loader.loaded_litellm()
        if litellm is not None:
            return litellm
        await _ready_without_litellm()
        endpoint = self.endpoint
        if models and all(endpoint.light(model) for model in models):
            return None
        return await litellm_loader.load_litellm()

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
        config, endpoint = self.config, self.endpoint
        names = set(models)
        for model in models:
            names.update(endpoint.models_behind(model))
        missing = windows.missing_model_info(sorted(names))
        if litellm is None:
            windows.look_up_in_price_map(missing)
            missing = []
        # A local server says what window it runs each model with (once per server).
        unasked = (
            [m for m in models if not local_servers.asked(config.api_base, m)]
            if endpoint.probes_local_servers
            else []
        )
        if missing or unasked:
            await asyncio.gather(
                *([asyncio.to_thread(windows.look_up, litellm, missing)] if missing else []),
                *(local_servers.ask(config.api_base, m, config.api_key) for m in unasked),
            )
        if sample and config.api_base and endpoint.probes_local_servers:
            await windows.learn_tokenizers(config.api_base, set(models), sample, config.api_key)

    def _windows_settled(self, model: str) -> bool:
        """Whether looking ``model``'s windows up again would learn nothing: litellm (or
        its price map) was asked, and a local server, if any, answered (a guessed
        window is asked again after a while)."""
        endpoint = self.endpoint
        if windows.missing_model_info([model, *endpoint.models_behind(model)]):
            return False
        return not endpoint.probes_local_servers or local_servers.settled(
            self.config.api_base, model
        )

    def _server_count(self, model: str) -> windows.ServerCount | None:
        """The server's own count of a text's tokens, where it has one (a local
        llama.cpp's or vLLM's ``/tokenize``): it reads as the model does."""
        config = self.config
        api_base = config.api_base
        if not (
            api_base
            and self.endpoint.probes_local_servers
            and local_servers.tokenizes(api_base, model)
        ):
            return None
        return lambda text: local_servers.count_tokens(api_base, model, text, config.api_key)

    def input_window(self, model: str | None = None, advice: bool = False) -> int | None:
        """Input tokens ``model`` takes, if known (see ``windows.input_window``;
        ``advice``: a guessed window counts too, for planning, never for refusing)."""
        model = model or self.config.effective_sub_model
        endpoint = self.endpoint
        return windows.input_window(
            litellm_loader.loaded_litellm(),
            model,
            endpoint.identity,
            self.config.context_window,
            endpoint.models_behind(model),
            advice,
        )

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
        return await budget.admit_batch(
            ledger,
            litellm,
            model,
            self.endpoint.highest_rates(model, litellm),
            conversations,
            max_tokens,
            self.config.litellm_kwargs,
        )

    async def _complete(self, call: Call, messages: Messages) -> Completion:
        call.started = time.perf_counter()  # its time counts from when it holds a slot
        hit = self._from_cache(call, messages)
        if hit is not None:
            return hit
        await self._prepare(call, messages)
        if budget.budgets_of(call.ledger):
            call.reservation = await budget.admit(
                call.ledger,
                call.litellm,
                call.model,
                self.endpoint.highest_rates(call.model, call.litellm),
                call.messages,
                call.params,  # (tools, n... from litellm_kwargs: billed, so held)
                call.reservation,
            )
        else:  # (no budget: nothing to hold, and no work to find out what)
            call.reservation = None
        return self._record(call, await self._send(call))

    # -- 1. cache ----------------------------------------------------------------------
    def _from_cache(self, call: Call, messages: Messages) -> Completion | None:
        cache = self.cache
        if cache is None:
            return None
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

    # -- 2. prepare --------------------------------------------------------------------
    async def _prepare(self, call: Call, messages: Messages) -> None:
        config, model, endpoint = self.config, call.model, self.endpoint
        litellm = litellm_loader.loaded_litellm()
        if litellm is None and not (_wire_is_ready and price_map.ready()):
            await _ready_without_litellm()
        plan = endpoint.plan(model, litellm)
        # litellm only when the call needs it (another provider, a Router...): an
        # OpenAI-compatible endpoint's call leaves without the import, near its window
        # and under a budget too (they count without it: ``windows``, ``budget``).
        if litellm is None and (
            plan.transport is None
            or keys.key_check_needs_litellm(config, model)  # (whose key RLM.api_key is)
        ):
            litellm = await litellm_loader.load_litellm()
            plan = endpoint.plan(model, litellm)
        call.litellm = litellm
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
        if plan.windows_unsettled:
            await self.look_up_windows(model, litellm=litellm)
            plan.windows_unsettled = not self._windows_settled(model)
        window = self.input_window(model)
        if window is not None:
            # A prompt the model cannot take is not sent (it would be billed or refused);
            # one that fits beside a shorter answer asks for less (windows.fit_answer).
            call.params["max_tokens"] = await windows.fit_answer(
                litellm,
                model,
                messages,
                window,
                call.params["max_tokens"],
                self._server_count(model),
            )
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

    # -- 3. send -----------------------------------------------------------------------
    async def _send(self, call: Call) -> Answer:
        """Attempts until one answers (or breaks off with text), or the call fails."""
        tokens = call.gate.estimate_tokens(call.characters)
        while True:
            ticket = await self._enter_gate(call, tokens)
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
            await self._after_failure(call, ticket, failure)

    async def _enter_gate(self, call: Call, tokens: float) -> Ticket:
        """Wait for the endpoint's pause, concurrency and pace, within the time this
        call has: its own deadline, and ``RLM.rate_limit_wait`` once rate limited."""
        deadline = (
            None if call.limited_since is None else call.limited_since + self.config.rate_limit_wait
        )
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
            raise self._rate_limited_too_long(
                call, f"the provider's limit would hold it {exc.args[0]:.0f}s more"
            ) from None
        if step_deadline is not None and time.monotonic() >= step_deadline:
            call.gate.failed(ticket)  # nothing is sent that could not finish in time
            raise call.out_of_time("before it could be sent")
        return ticket

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

    async def _after_failure(self, call: Call, ticket: Ticket, failure: Exception) -> None:
        """Decide on a failed attempt: return to try again (at once, or after a backoff),
        or raise the call's ``LLMQueryError``."""
        gate, config, model = call.gate, self.config, call.model
        if is_rate_limit(failure):
            # Redacted before anything reads its text: the message made of it is cut,
            # and a key cut in two would be found by neither half.
            redact_causes(failure, self.redactor())
            # Not a failure: the gate holds this call (and every other call to this
            # endpoint) back until the provider's limit allows it, then it goes again.
            gate.rate_limited_by(ticket, headers_of(failure), str(failure))
            call.rate_limited += 1
            call.limited_since = call.limited_since or ticket.sent_at
            if time.monotonic() - call.limited_since < config.rate_limit_wait:
                return
            raise self._rate_limited_too_long(call, describe_exception(failure)) from failure
        gate.failed(ticket)
        if call.litellm is None and keys.may_be_key_failure(failure):
            # What the key failure says (which variable, where from) is litellm's to tell.
            call.litellm = await litellm_loader.load_litellm()
        refused = self.endpoint.key_failure(failure, model)
        if refused is not None:  # the same key would be refused again: never retried
            raise call.failed(refused, self.redactor()) from failure
        windows.learn_from(failure, call.endpoint, model, call.messages)
        if retries.refused_connection(failure):
            deadline = call.options.deadline
            within_time = deadline is None or time.monotonic() + retries.MIN_ATTEMPT_S < deadline
            routed_around = len(self.endpoint.models_behind(model)) > 1
            if routed_around and call.resent < retries.REFUSED_RESENDS and within_time:
                # A deployment of a Router's group refused the connection: nothing
                # reached a server. Ask the Router again without spending a retry:
                # until refusals put that deployment in its cooldown, the Router's
                # shuffle may pick it for every attempt of a call.
                call.resent += 1
                await asyncio.sleep(0)  # (the Router records the refusal first)
                return
        if call.marked is not call.messages and refuses_markers(failure):
            # A provider that rejects cache_control markers: send it plain, from now
            # on, without spending a retry.
            PROFILES.model(model).refuses_cache_markers = True
            call.marked = call.request["messages"] = call.messages
            return
        state = call.state
        if call.streaming and state is not None and not state.chunks and not state.received:
            if retries.cannot_stream(failure):
                PROFILES.model(model).cannot_stream = True
                call.streaming = False
                return
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
            raise call.failed(explained, self.redactor()) from explained
        call.retries += 1
        try:
            await asyncio.sleep(delay)
        except asyncio.CancelledError:
            call.cancelled()
            raise

    # -- 4. record ---------------------------------------------------------------------
    def _record(self, call: Call, answer: Answer) -> Completion:
        model = call.model
        completion = Completion(
            answer.text,
            model,
            answer.input_tokens,
            answer.output_tokens,
            cost_usd=answer.cost_usd,
            retries=call.retries,
            elapsed_s=time.perf_counter() - call.started,
            cached_input_tokens=answer.cached_input_tokens,
            cache_write_tokens=answer.cache_write_tokens,
            streamed=call.streaming,
            # Broken off: whatever the last chunk said, it is not where the model ended
            # (its text is then a marked ``CutAnswer``).
            finish_reason=answer.finish_reason if call.cut_reason is None else None,
            cut_reason=call.cut_reason,
        )
        if call.cut_reason is None:
            windows.learn_usage(
                model,
                call.messages,
                completion.input_tokens,
                completion.output_tokens,
                completion.finish_reason == "stop",
            )
        call.ledger.record(
            record := call.spent.record(
                model,
                completion.input_tokens,
                completion.output_tokens,
                completion.cost_usd,
                retries=call.retries,
                rate_limited=call.rate_limited,
                elapsed_s=completion.elapsed_s,
                cached_input_tokens=completion.cached_input_tokens,
                cache_write_tokens=completion.cache_write_tokens,
                cache_saved_usd=cache_saving(
                    call.litellm,
                    model,
                    completion.cached_input_tokens,
                    completion.cache_write_tokens,
                ),
                cut_off=completion.incomplete,
            )
        )
        if call.reservation is not None:  # (a reported cost prices an unpriced model)
            call.reservation.landed(record)
        call.release()  # what it cost is recorded: the rest of its hold goes back
        # A broken-off answer is never kept; one cut at max_tokens only when that was
        # the max_tokens of the key (a hit then says cut_off, as the original did).
        if (
            call.cache is not None
            and call.key is not None
            and completion.cut_reason is None
            and (not completion.cut_off or call.params["max_tokens"] == call.identity.max_tokens)
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
        return completion

    def _rate_limited_too_long(self, call: Call, why: str) -> LLMQueryError:
        return call.rate_limited_too_long(why, self.config.rate_limit_wait, self.redactor())
