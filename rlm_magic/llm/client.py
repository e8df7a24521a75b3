"""The async LLM client: every model call in rlm-magic goes through ``LLMClient.complete``.

It owns the things that must be shared by all calls of a session: the concurrency
limit, the provider's rate gate (``ratelimit``), timeouts, retries with backoff,
streaming, the optional disk cache and the usage ledger. Calls go to
``litellm.acompletion``, or to ``Router.acompletion`` when ``RLM.model_list`` is set
(``routing``: the Router then retries), always on the caller's running loop: litellm
caches its async HTTP clients per event loop, so a call on a second loop would break
them. The blocking ``litellm.completion`` is never used. OpenAI-compatible endpoints
skip litellm's per-call machinery: ``openai_wire`` sends them over aiohttp (see
``transport``), with the same gate, retries, errors, usage and cost.
"""

from __future__ import annotations

import asyncio
import os
import random
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from ..errors import ConfigError, LLMQueryError, describe_exception
from . import local_servers, openai_wire, routing, windows
from .limiter import ConcurrencyLimiter
from .prompt_cache import REFUSED as _NO_MARKERS
from .prompt_cache import mark_prefix, needs_markers, refuses_markers
from .ratelimit import (
    RateGate,
    RateLimitWaitExceeded,
    gate_for,
    headers_of,
    is_rate_limit,
    non_negative,
)
from .redaction import Redactor, off_loop_if_large
from .streaming import OnText, StreamStalled, StreamState
from .transport import Answer, LiteLLMTransport
from .usage import CallRecord, UsageLedger

if TYPE_CHECKING:
    from ..config import RLMConfig
    from .cache import ResponseCache

Messages = list[dict[str, Any]]

_litellm = None
_litellm_lock: asyncio.Lock | None = None


def _import_litellm():
    global _litellm
    if _litellm is None:
        # Without this, importing litellm fetches its price map from the internet (and
        # logs warnings when offline). The bundled map is current for our pinned range.
        os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
        import gc

        import litellm

        litellm.suppress_debug_info = True  # no "Give Feedback / Get Help" banners in cells
        # pydantic warns, the first time litellm builds some of its own types (a Router, a
        # streamed answer), that they use `ReadOnly`: noise in a cell, nothing to act on.
        warnings.filterwarnings(
            "ignore", message=r".*is using the `ReadOnly` qualifier", category=UserWarning
        )
        warnings.filterwarnings(
            "ignore", message=r".*are using the `ReadOnly` qualifier", category=UserWarning
        )
        # A streamed call cancelled (an interrupt, a stopped step) at the moment litellm
        # has made its streaming coroutine but not yet awaited it leaves this behind.
        warnings.filterwarnings(
            "ignore",
            message=r"coroutine '.*async_streaming' was never "
            r"awaited",
            category=RuntimeWarning,
        )
        # The wire transport's TLS context (certificates loaded: ~10 ms) is made here,
        # off the loop, rather than when the first request opens a session.
        openai_wire.ssl_context()
        # litellm's import leaves ~400k objects for the cyclic GC to walk: a full
        # collection then takes ~180 ms, a stall of the kernel's loop in the middle of
        # a batch. They live as long as the process; freezing moves them out of the
        # collector's way (they are still freed by reference counting).
        gc.collect()
        gc.freeze()
        _litellm = litellm
    return _litellm


async def load_litellm():
    """Import litellm on first use, in a thread: the import takes seconds, and the
    kernel's loop (progress bars, other cells' tasks) should keep running meanwhile."""
    global _litellm_lock
    if _litellm is not None:
        return _litellm
    if _litellm_lock is None:
        _litellm_lock = asyncio.Lock()
    async with _litellm_lock:
        if _litellm is None:
            await asyncio.to_thread(_import_litellm)
    return _litellm


_CALLS = 0  # calls under way, in every client of the process


def _park_logging_worker_soon() -> None:
    """litellm logs each answer through a worker task it starts on the loop of the
    call and never ends: once no call is under way (a second later, after litellm has
    queued its last callbacks), they run and the task ends. The next call starts it
    again."""
    if _litellm is None:
        return
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        return

    def park() -> None:
        if not _CALLS:
            task = loop.create_task(_park_logging_worker())
            _PARKING.add(task)  # held: the loop keeps only a weak reference
            task.add_done_callback(_PARKING.discard)

    loop.call_later(1.0, park)


_PARKING: set = set()


async def _park_logging_worker() -> None:
    try:
        from litellm.litellm_core_utils.logging_worker import GLOBAL_LOGGING_WORKER as worker
    except ImportError:  # a litellm without one
        return
    if _CALLS or getattr(worker, "_worker_task", None) is None:
        return
    try:
        await asyncio.wait_for(worker.flush(), 5.0)
        if not _CALLS:
            await worker.stop()
    except Exception:  # noqa: BLE001 - logging's housekeeping must never fail a cell
        pass


def litellm_is_loading() -> bool:
    """True while litellm's first import is underway (seconds, in a thread): calls
    already admitted are waiting for it, not in flight, and progress says so."""
    return _litellm is None and _litellm_lock is not None and _litellm_lock.locked()


async def close_loop_clients() -> None:
    """Close litellm's cached HTTP clients before the running loop ends.

    litellm keeps a set of connection pools per event loop and never closes them; a
    script that calls ``RLM.run`` (one ``asyncio.run`` each) would otherwise leave every
    run's connections open until the process runs out of descriptors."""
    close = getattr(_litellm, "close_litellm_async_clients", None)
    if close is not None:
        await close()
    await openai_wire.close_sessions()


@dataclass(frozen=True)
class Completion:
    """A model's answer and what it cost."""

    text: str
    model: str
    input_tokens: int = 0
    output_tokens: int = 0
    cost_usd: float | None = None
    retries: int = 0
    elapsed_s: float = 0.0
    cached: bool = False
    cached_input_tokens: int = 0  # served from the provider's prompt cache
    cache_write_tokens: int = 0
    streamed: bool = False
    finish_reason: str | None = None  # "length": the answer stopped at max_tokens
    # Why a streamed answer broke off before its end (a stall, the step's deadline, a
    # server gone): ``text`` is what had arrived, with "[answer cut off: why]" after it.
    cut_reason: str | None = None

    @property
    def cut_off(self) -> bool:
        """The answer stopped at max_tokens (see ``incomplete`` for any cut)."""
        return self.finish_reason == "length"

    @property
    def incomplete(self) -> bool:
        """The answer may end before the model meant it to: stopped at max_tokens, or
        broken off (a stall, the step's deadline, a server gone). Such an answer is
        never taken as a final answer, cached or kept for a re-run as if whole."""
        return self.cut_off or self.cut_reason is not None


def is_retryable(exc: BaseException) -> bool:
    """408/409, 5xx, timeouts and connection failures are worth another try;
    authentication, bad requests and unknown models are not."""
    if isinstance(exc, (asyncio.TimeoutError, TimeoutError, ConnectionError)):
        return True
    status = getattr(exc, "status_code", None)
    if isinstance(status, int):
        return status in (408, 409) or status >= 500
    return type(exc).__name__ in {"APIConnectionError", "Timeout", "APITimeoutError"}


def _retry_after(exc: BaseException) -> float | None:
    response = getattr(exc, "response", None)
    headers = getattr(response, "headers", None)
    try:
        return float(headers.get("retry-after")) if headers else None
    except (TypeError, ValueError):
        return None


class LLMClient:
    """Sends chat requests, shares one concurrency limit and records usage."""

    def __init__(self, config: RLMConfig, ledger: UsageLedger | None = None):
        self.config = config
        self.ledger = ledger if ledger is not None else UsageLedger()
        self.limiter = ConcurrencyLimiter(lambda: config.max_concurrency)
        self._cache: ResponseCache | None = None
        self._routed: tuple[Any, Any] | None = None  # (configuration, litellm.Router)

    # -- cache ------------------------------------------------------------------------
    @property
    def cache(self) -> ResponseCache | None:
        if not self.config.cache:
            return None
        directory = self.config.cache_dir
        if self._cache is None or self._cache.directory != directory:
            from .cache import ResponseCache

            self._cache = _cache_call(ResponseCache, directory)
        return self._cache

    # -- calls ------------------------------------------------------------------------
    async def complete(
        self,
        messages: Messages,
        *,
        model: str | None = None,
        max_tokens: int | None = None,
        ledger: UsageLedger | None = None,
        slot_held: bool = False,
        redactor: Redactor | None = None,
        **options,
    ) -> Completion:
        """One chat completion with retries. Raises ``LLMQueryError`` when it fails.

        ``slot_held`` says the caller already holds a limiter slot for this call (the
        batch runner acquires slots itself so it can start tasks as slots free up).
        ``options`` (see ``CallOptions``): ``stream``, ``on_text``, ``deadline`` and
        ``cache_prefix``.
        """
        model = model or self.config.effective_sub_model
        ledger = ledger if ledger is not None else self.ledger
        call = CallOptions(**options)
        global _CALLS
        _CALLS += 1
        try:
            if slot_held:
                return await self._complete(messages, model, max_tokens, ledger, redactor, call)
            async with self.limiter:
                return await self._complete(messages, model, max_tokens, ledger, redactor, call)
        finally:
            _CALLS -= 1
            if not _CALLS:
                _park_logging_worker_soon()

    def gate(self, model: str | None = None) -> RateGate:
        """The rate gate of ``model`` at this client's endpoint (shared process-wide)."""
        config = self.config
        model = model or config.effective_sub_model
        if config.model_list:
            # A group's deployments send headers of their own limits, not the group's:
            # through a Router the gate pauses on 429s but learns no pace from headers.
            return gate_for(
                model, self._endpoint(), None, config.rpm, config.tpm, learns_from_headers=False
            )
        return gate_for(model, config.api_base, config.api_key, config.rpm, config.tpm)

    async def look_up_windows(self, *models: str) -> None:
        """Learn these models' windows from litellm once each, off the loop: for some
        providers that is an HTTP request, which would stall every cell's work."""
        litellm = await load_litellm()
        config = self.config
        names = set(models)
        if config.model_list:
            for model in models:
                names.update(routing.deployments(config.model_list, model))
        missing = windows.missing_model_info(sorted(names))
        # A local server says what window it runs each model with (once per server).
        unasked = (
            []
            if config.model_list
            else [m for m in models if not local_servers.asked(config.api_base, m)]
        )
        if missing or unasked:
            await asyncio.gather(
                *([asyncio.to_thread(windows.look_up, litellm, missing)] if missing else []),
                *(local_servers.ask(config.api_base, m, config.api_key) for m in unasked),
            )

    def input_window(self, model: str | None = None, advice: bool = False) -> int | None:
        """Input tokens ``model`` takes, if known (see ``windows.input_window``;
        ``advice``: a guessed window counts too, for planning, never for refusing)."""
        model = model or self.config.effective_sub_model
        behind = (
            routing.deployments(self.config.model_list, model) if self.config.model_list else ()
        )
        return windows.input_window(
            _litellm, model, self._endpoint(), self.config.context_window, behind, advice
        )

    def redactor(self) -> Redactor:
        """Removes current secrets; a batch builds one and shares it between its calls."""
        return Redactor(extra=self.config.configured_secrets())

    def _endpoint(self) -> str | None:
        """Where calls go: the api_base, or the Router configuration's identity."""
        config = self.config
        if config.model_list:
            return routing.identity(config.model_list, config.router_settings)
        return config.api_base

    def _router(self, litellm):
        """The Router for the current model list, built once per configuration."""
        config = self.config
        identity = (self._endpoint(), config.max_retries, config.timeout)
        if self._routed is None or self._routed[0] != identity:
            router = routing.build_router(
                litellm,
                config.model_list,
                config.router_settings,
                num_retries=config.max_retries,
                timeout=config.timeout,
            )
            self._routed = (identity, router)
        return self._routed[1]

    def transport(self, model: str, litellm=None):
        """How calls to ``model`` are sent: straight over the wire when the endpoint is
        OpenAI-compatible and the request is OpenAI's as it stands, else by litellm."""
        litellm = litellm or _litellm
        config = self.config
        if config.model_list:
            return LiteLLMTransport(self._router(litellm).acompletion, litellm)
        if config.wire_transport and openai_wire.fits(config.litellm_kwargs):
            route = openai_wire.route_for(litellm, model, config.api_base, config.api_key)
            if route is not None:
                return openai_wire.WireTransport(route, litellm)
        return LiteLLMTransport(litellm.acompletion, litellm)

    def _request(self, model: str, messages: Messages, params: dict) -> dict:
        """The request as litellm takes it (the wire transport sends the same)."""
        config = self.config
        request = {
            "model": model,
            "messages": messages,
            "timeout": config.timeout,
            # Retries are ours (backoff, jitter, counted in the ledger): stop the
            # provider SDK from retrying underneath us.
            "max_retries": 0,
            **params,
        }
        if not config.model_list:
            if config.api_base:
                request["api_base"] = config.api_base
            if config.api_key:
                request["api_key"] = config.api_key
        return request

    async def _complete(
        self, messages, model, max_tokens, ledger, redactor, call: CallOptions
    ) -> Completion:
        config = self.config
        params = {"max_tokens": max_tokens or config.max_tokens, **config.litellm_kwargs}
        if call.response_format is not None:  # typed answers: see structured.py
            params["response_format"] = call.response_format
        started = time.perf_counter()

        cache, key = self.cache, None
        if cache is not None:
            from .cache import request_key

            key = request_key(
                {"model": model, "messages": messages, "api_base": self._endpoint(), **params}
            )
            hit = _cache_call(cache.get, key)
            if hit is not None:
                completion = Completion(
                    hit["text"],
                    model,
                    hit["input_tokens"],
                    hit["output_tokens"],
                    cost_usd=0.0,
                    cached=True,
                    elapsed_s=time.perf_counter() - started,
                    finish_reason=hit.get("finish_reason"),
                )
                ledger.record(
                    CallRecord(
                        model,
                        completion.input_tokens,
                        completion.output_tokens,
                        0.0,
                        cached=True,
                        elapsed_s=completion.elapsed_s,
                    )
                )
                return completion

        litellm = await load_litellm()
        messages = await redact_messages(messages, redactor or self.redactor())
        characters = sum(len(m["content"]) for m in messages if isinstance(m.get("content"), str))
        await self.look_up_windows(model)
        window = self.input_window(model)
        if window is not None:
            # A prompt the model cannot take is not sent (it would be billed or refused);
            # one that fits beside a shorter answer asks for less (windows.fit_answer).
            params["max_tokens"] = await windows.fit_answer(
                litellm, model, messages, window, params["max_tokens"]
            )
        # The cache key holds the max_tokens asked for; an answer cut at a lower one
        # (fit to this window) is not the answer to that request.
        asked_tokens = max_tokens or config.max_tokens
        plain_messages = messages
        if call.cache_prefix and config.prompt_caching and needs_markers(litellm, model):
            messages = mark_prefix(messages)
        streaming = call.stream and config.stream and model not in _CANNOT_STREAM
        spent = _Spent()  # tokens of attempts cut off by a stall, billed all the same
        state: StreamState | None = None
        cut_reason: str | None = None
        request = self._request(model, messages, params)
        if config.model_list:
            # The Router retries, on another deployment when it can (see routing.py).
            max_retries = 0
            attempt_timeout = config.timeout * (config.max_retries + 1)
            if model not in routing.groups(config.model_list):
                raise self._failed(
                    ledger,
                    model,
                    0,
                    0,
                    started,
                    ConfigError(
                        f"{model!r} is not a model group of RLM.model_list (its groups: "
                        f"{', '.join(routing.groups(config.model_list))})"
                    ),
                )
        else:
            max_retries, attempt_timeout = config.max_retries, config.timeout
        transport = self.transport(model, litellm)

        gate = self.gate(model)
        tokens = gate.estimate_tokens(characters)
        retries = rate_limited = 0
        limited_since: float | None = None  # when this call first met a rate limit
        while True:
            deadline = None if limited_since is None else limited_since + config.rate_limit_wait
            if call.deadline is not None:
                deadline = min(deadline or call.deadline, call.deadline)
            try:
                ticket = await gate.enter(tokens, deadline)
            except asyncio.CancelledError:
                _record_cancelled(ledger, model, retries, started, rate_limited, spent)
                raise
            except RateLimitWaitExceeded as exc:
                if call.deadline is not None and deadline == call.deadline:
                    raise _out_of_time(
                        ledger,
                        model,
                        retries,
                        rate_limited,
                        started,
                        spent,
                        "before it could be sent"
                        if time.monotonic() >= call.deadline
                        else "while the provider's rate limit held it back",
                    ) from None
                raise self._rate_limit_failure(
                    ledger,
                    model,
                    retries,
                    rate_limited,
                    started,
                    limited_since,
                    f"the provider's limit would hold it {exc.args[0]:.0f}s more",
                ) from None
            if call.deadline is not None and time.monotonic() >= call.deadline:
                gate.failed(ticket)  # nothing is sent that could not finish in time
                raise _out_of_time(
                    ledger, model, retries, rate_limited, started, spent, "before it could be sent"
                )
            if state is not None and state.received and call.on_text is not None:
                call.on_text(None)  # the answer starts over
            state = StreamState(call.on_text) if streaming else None
            try:
                if state is not None:
                    answer = await transport.stream(
                        request,
                        state,
                        stall_timeout=call.time_left(config.timeout),
                        deadline=call.deadline,
                        messages=plain_messages,
                    )
                else:
                    answer = await asyncio.wait_for(
                        transport.complete(request), call.time_left(attempt_timeout)
                    )
            except asyncio.CancelledError:
                gate.failed(ticket)
                spent.add_partial(state, transport, plain_messages)
                _record_cancelled(ledger, model, retries, started, rate_limited, spent)
                raise
            except Exception as exc:  # noqa: BLE001 - every failure is reported below
                failure = exc
                partial = transport.partial(state, plain_messages)
                if partial is not None:
                    # Cut off after text arrived (a stall, the step's deadline, a server
                    # gone): that text is the answer, marked; starting over would throw
                    # away what was generated and pay for it again.
                    gate.failed(ticket)
                    answer = partial
                    cut_reason = self.redactor()(
                        str(_explained(failure, attempt_timeout, call, state))
                    )
                    break
                spent.add_partial(state, transport, plain_messages)
            else:
                gate.answered(ticket, answer.headers, answer.input_tokens or None, characters)
                break
            if is_rate_limit(failure):
                # Not a failure: the gate holds this call (and every other call to this
                # endpoint) back until the provider's limit allows it, then it goes again.
                gate.rate_limited_by(ticket, headers_of(failure))
                rate_limited += 1
                limited_since = limited_since or ticket.sent_at
                if time.monotonic() - limited_since < config.rate_limit_wait:
                    continue
                raise self._rate_limit_failure(
                    ledger,
                    model,
                    retries,
                    rate_limited,
                    started,
                    limited_since,
                    describe_exception(failure),
                ) from failure
            gate.failed(ticket)
            windows.learn_from(failure, self._endpoint(), model, plain_messages)
            if messages is not plain_messages and refuses_markers(failure):
                # A provider that rejects cache_control markers: send it plain, from
                # now on, without spending a retry.
                _NO_MARKERS.add(model)
                request["messages"] = messages = plain_messages
                continue
            if (
                streaming
                and state is not None
                and not state.chunks
                and not state.received
                and _cannot_stream(failure)
            ):
                _CANNOT_STREAM.add(model)
                streaming = False
                continue
            delay = random.uniform(0, config.retry_backoff * 2**retries)
            delay = max(delay, min(_retry_after(failure) or 0.0, 60.0))
            out_of_time = (
                call.deadline is not None
                and time.monotonic() + delay + _MIN_ATTEMPT_S >= call.deadline
            )
            final = call.may_retry is not None and not call.may_retry()
            # A prompt over the window is refused again as it stands: never retried
            # (the refusal taught the window and the estimate instead).
            final = final or windows.is_context_error(failure)
            if retries >= max_retries or not is_retryable(failure) or out_of_time or final:
                failure = _explained(failure, attempt_timeout, call, state)
                raise self._failed(
                    ledger, model, retries, rate_limited, started, failure, spent
                ) from failure
            retries += 1
            try:
                await asyncio.sleep(delay)
            except asyncio.CancelledError:
                _record_cancelled(ledger, model, retries, started, rate_limited, spent)
                raise

        completion = _completion_from(
            answer, model, retries, time.perf_counter() - started, streaming
        )
        if cut_reason is not None:
            completion = replace(
                completion,
                finish_reason=None,
                cut_reason=cut_reason,
                text=f"{completion.text}\n[answer cut off: {cut_reason}]",
            )
        else:
            windows.learn_usage(
                model,
                plain_messages,
                completion.input_tokens,
                completion.output_tokens,
                completion.finish_reason == "stop",
            )
        ledger.record(
            spent.record(
                model,
                completion.input_tokens,
                completion.output_tokens,
                completion.cost_usd,
                retries=retries,
                rate_limited=rate_limited,
                elapsed_s=completion.elapsed_s,
                cached_input_tokens=completion.cached_input_tokens,
                cache_write_tokens=completion.cache_write_tokens,
                cache_saved_usd=cache_saving(litellm, model, completion),
                cut_off=completion.incomplete,
            )
        )
        # A broken-off answer is never kept; one cut at max_tokens only when that was
        # the max_tokens of the key (a hit then says cut_off, as the original did).
        if (
            key is not None
            and completion.cut_reason is None
            and (not completion.cut_off or params["max_tokens"] == asked_tokens)
        ):
            _cache_call(
                cache.set,
                key,
                {
                    "text": completion.text,
                    "input_tokens": completion.input_tokens,
                    "output_tokens": completion.output_tokens,
                    "finish_reason": completion.finish_reason,
                },
            )
        return completion

    def _failed(
        self,
        ledger: UsageLedger,
        model: str,
        retries: int,
        rate_limited: int,
        started: float,
        failure: BaseException,
        spent: _Spent | None = None,
    ) -> LLMQueryError:
        """The call failed for good: record it (with any tokens already billed)."""
        error = _redacted(
            LLMQueryError(model, explain_proxy_failure(failure, model), retries=retries),
            failure,
            self.redactor(),
        )
        ledger.record(
            (spent or _Spent()).record(
                model,
                retries=retries,
                error=str(error),
                rate_limited=rate_limited,
                elapsed_s=time.perf_counter() - started,
            )
        )
        return error

    def _rate_limit_failure(
        self,
        ledger: UsageLedger,
        model: str,
        retries: int,
        rate_limited: int,
        started: float,
        limited_since: float,
        why: str,
    ) -> LLMQueryError:
        waited = time.monotonic() - limited_since
        return self._failed(
            ledger,
            model,
            retries,
            rate_limited,
            started,
            RuntimeError(
                f"rate limited for {waited:.0f}s ({rate_limited} rate-limited responses), "
                f"past RLM.rate_limit_wait={self.config.rate_limit_wait:g}s; {why}"
            ),
        )


def _redacted(error: LLMQueryError, failure: BaseException, redactor: Redactor) -> LLMQueryError:
    """A provider's error text may echo the request (a 401 quoting "Bearer sk-..."):
    the message that is raised, recorded and shown to the model's code has no secret."""
    message = redactor(str(error))
    if message != str(error):
        error.args = (message,)
        _redact_causes(failure, redactor)
    return error


def _redact_causes(failure: Any, redactor: Redactor) -> None:
    """The provider's exceptions under the error (a traceback shows them), redacted in
    place as far as they let us."""
    seen: set[int] = set()
    while isinstance(failure, BaseException) and id(failure) not in seen:
        seen.add(id(failure))
        try:
            if isinstance(getattr(failure, "message", None), str):
                failure.message = redactor(failure.message)
            failure.args = tuple(redactor(a) if isinstance(a, str) else a for a in failure.args)
        except (AttributeError, TypeError):  # a read-only attribute: left as it is
            pass
        failure = failure.__cause__ or failure.__context__


def _record_cancelled(
    ledger: UsageLedger,
    model: str,
    retries: int,
    started: float,
    rate_limited: int = 0,
    spent: _Spent | None = None,
) -> None:
    # A cancelled call may already have been billed in part: it stays in the ledger,
    # with the tokens it had streamed.
    spent = spent or _Spent()
    ledger.record(
        spent.record(
            model,
            retries=retries,
            error="cancelled",
            rate_limited=rate_limited,
            elapsed_s=time.perf_counter() - started,
        )
    )


def _cache_call(method, *args):
    """A cache that fails (disk full, locked) must not cost the user a paid answer:
    warn once and go on without it."""
    try:
        return method(*args)
    except Exception as exc:  # noqa: BLE001 - any storage error
        if not getattr(_cache_call, "warned", False):
            import warnings

            warnings.warn(
                f"rlm-magic cache is not working, going on without it: {exc}",
                RuntimeWarning,
                stacklevel=2,
            )
            _cache_call.warned = True
        return None


async def redact_messages(messages: Messages, redactor: Redactor) -> Messages:
    """Every message as it may be sent: with secrets removed. The last line of defence:
    whatever code built the prompt, no environment secret reaches a provider."""
    if not redactor:
        return messages

    def redact_all():
        return [
            {**m, "content": redactor(m["content"])} if isinstance(m.get("content"), str) else m
            for m in messages
        ]

    size = sum(len(m.get("content") or "") for m in messages if isinstance(m.get("content"), str))
    return await off_loop_if_large(size, redact_all)


def _completion_from(
    answer: Answer, model: str, retries: int, elapsed: float, streamed: bool = False
) -> Completion:
    return Completion(
        answer.text,
        model,
        answer.input_tokens,
        answer.output_tokens,
        cost_usd=answer.cost_usd,
        retries=retries,
        elapsed_s=elapsed,
        cached_input_tokens=answer.cached_input_tokens,
        cache_write_tokens=answer.cache_write_tokens,
        streamed=streamed,
        finish_reason=answer.finish_reason,
    )


def _cost_of(response, litellm) -> float | None:
    """Dollars for this response, or None when litellm does not know the price."""
    hidden = getattr(response, "_hidden_params", None) or {}
    if "response_cost" in hidden:
        # litellm already priced it (None: it knows no price); asking again costs
        # ~1 ms of CPU per call for the same answer.
        cost = hidden["response_cost"]
    else:
        try:
            cost = litellm.completion_cost(completion_response=response)
        except Exception:  # noqa: BLE001 - litellm raises for models without a price
            cost = None
    if cost is None:
        # A LiteLLM Proxy prices the call with its upstream's price and says so, even
        # when the name it answers under means nothing to litellm's price map here.
        cost = non_negative((hidden.get("additional_headers") or {}).get(PROXY_COST_HEADER))
    return float(cost) if cost is not None else None


PROXY_COST_HEADER = "llm_provider-x-litellm-response-cost"


def explain_proxy_failure(failure: BaseException, model: str) -> BaseException | str:
    """A LiteLLM Proxy without a database answers an unknown key with a 400 "No connected
    db." (it would look the key up there): say what that means."""
    if model.startswith("litellm_proxy/") and "No connected db" in str(failure):
        return (
            "the LiteLLM Proxy rejected the API key: it is not the proxy's master "
            "key, and the proxy has no database to look other keys up in"
        )
    return failure


# -- streaming, deadlines and prompt caching -------------------------------------------------
# Models whose provider refused a streamed request: not streamed for the rest of the
# session.
_CANNOT_STREAM: set[str] = set()
_MIN_ATTEMPT_S = 0.5  # no retry is started with less time than this before the deadline


@dataclass(frozen=True)
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
    response_format: dict | None = None  # sent as is; answers are checked by structured.py

    def time_left(self, timeout: float) -> float:
        if self.deadline is None:
            return timeout
        return max(0.01, min(timeout, self.deadline - time.monotonic()))


class _Spent:
    """Tokens and dollars of attempts that were cut off after the provider had started
    answering: they are billed, so they go into the call's record."""

    def __init__(self):
        self.input_tokens = self.output_tokens = 0
        self.cost_usd: float | None = None

    def add_partial(self, state: StreamState | None, transport, messages) -> None:
        answer = transport.partial(state, messages)
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
        **fields,
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


def _cannot_stream(exc: BaseException) -> bool:
    """A provider that does not stream says so with a 400 (or litellm refuses)."""
    status = getattr(exc, "status_code", None)
    return (
        status in (400, 422) or type(exc).__name__ == "UnsupportedParamsError"
    ) and "stream" in str(exc).lower()


def _explained(
    failure: BaseException, timeout: float, call: CallOptions, state: StreamState | None
) -> BaseException:
    """Timeouts as one line that says which limit was hit."""
    if (
        call.deadline is not None
        and time.monotonic() >= call.deadline - _MIN_ATTEMPT_S
        and isinstance(failure, (asyncio.TimeoutError, TimeoutError))
    ):
        got = f" after {len(state.text):,} characters" if state and state.received else ""
        return TimeoutError(f"the REPL step's time ran out{got} (step_timeout)")
    if isinstance(failure, StreamStalled):
        got = f" after {len(state.text):,} characters" if state and state.received else ""
        return TimeoutError(f"{failure}{got} (timeout={timeout:g}s)")
    if isinstance(failure, asyncio.TimeoutError):
        return TimeoutError(f"no answer within timeout={timeout:g}s")
    return failure


def _out_of_time(
    ledger: UsageLedger,
    model: str,
    retries: int,
    rate_limited: int,
    started: float,
    spent: _Spent,
    when: str,
) -> LLMQueryError:
    error = LLMQueryError(
        model, TimeoutError(f"the REPL step's time ran out {when} (step_timeout)"), retries=retries
    )
    ledger.record(
        spent.record(
            model,
            retries=retries,
            error=str(error),
            rate_limited=rate_limited,
            elapsed_s=time.perf_counter() - started,
        )
    )
    return error


def cache_saving(litellm, model: str, completion: Completion) -> float | None:
    """Dollars the provider's prompt cache saved on this call (negative when writing the
    cache cost more than reading saved), at litellm's prices; None if unpriced."""
    if not (completion.cached_input_tokens or completion.cache_write_tokens):
        return 0.0
    from .prompt_cache import saving

    return saving(litellm, model, completion.cached_input_tokens, completion.cache_write_tokens)
