"""The async LLM client: every model call in rlm-magic goes through ``LLMClient.complete``.

It owns the things that must be shared by all calls of a session: the concurrency
limit, timeouts, retries with backoff, the optional disk cache and the usage ledger.
Only ``litellm.acompletion`` is used, on the caller's running loop: litellm caches its
async HTTP clients per event loop, so running a call on a second loop would break them.
"""

from __future__ import annotations

import asyncio
import os
import random
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..errors import ConfigError, LLMQueryError, describe_exception
from . import routing
from .limiter import ConcurrencyLimiter
from .ratelimit import RateGate, RateLimitWaitExceeded, gate_for, headers_of, is_rate_limit
from .redaction import Redactor, off_loop_if_large
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


async def close_loop_clients() -> None:
    """Close litellm's cached HTTP clients before the running loop ends.

    litellm keeps a set of connection pools per event loop and never closes them; a
    script that calls ``RLM.run`` (one ``asyncio.run`` each) would otherwise leave every
    run's connections open until the process runs out of descriptors."""
    close = getattr(_litellm, "close_litellm_async_clients", None)
    if close is not None:
        await close()


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

    def __init__(self, config: "RLMConfig", ledger: UsageLedger | None = None):
        self.config = config
        self.ledger = ledger if ledger is not None else UsageLedger()
        self.limiter = ConcurrencyLimiter(lambda: config.max_concurrency)
        self._cache: ResponseCache | None = None
        self._routed: tuple[Any, Any] | None = None  # (configuration, litellm.Router)

    # -- cache ------------------------------------------------------------------------
    @property
    def cache(self) -> "ResponseCache | None":
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
    ) -> Completion:
        """One chat completion with retries. Raises ``LLMQueryError`` when it fails.

        ``slot_held`` says the caller already holds a limiter slot for this call (the
        batch runner acquires slots itself so it can start tasks as slots free up).
        """
        model = model or self.config.effective_sub_model
        ledger = ledger if ledger is not None else self.ledger
        if slot_held:
            return await self._complete(messages, model, max_tokens, ledger, redactor)
        async with self.limiter:
            return await self._complete(messages, model, max_tokens, ledger, redactor)

    def gate(self, model: str | None = None) -> RateGate:
        """The rate gate of ``model`` at this client's endpoint (shared process-wide)."""
        config = self.config
        model = model or config.effective_sub_model
        if config.model_list:
            # A group's deployments send headers of their own limits, not the group's:
            # through a Router the gate pauses on 429s but learns no pace from headers.
            return gate_for(model, self._endpoint(), None, config.rpm, config.tpm,
                            learns_from_headers=False)
        return gate_for(model, config.api_base, config.api_key, config.rpm, config.tpm)

    def redactor(self) -> Redactor:
        """Removes current secrets; a batch builds one and shares it between its calls."""
        return Redactor(extra=[self.config.api_key, *routing.secrets(self.config.model_list)])

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
            router = routing.build_router(litellm, config.model_list, config.router_settings,
                                          num_retries=config.max_retries,
                                          timeout=config.timeout)
            self._routed = (identity, router)
        return self._routed[1]

    async def _complete(self, messages, model, max_tokens, ledger, redactor) -> Completion:
        config = self.config
        params = {"max_tokens": max_tokens or config.max_tokens, **config.litellm_kwargs}
        started = time.perf_counter()

        cache, key = self.cache, None
        if cache is not None:
            from .cache import request_key

            key = request_key({"model": model, "messages": messages,
                               "api_base": self._endpoint(), **params})
            hit = _cache_call(cache.get, key)
            if hit is not None:
                completion = Completion(hit["text"], model, hit["input_tokens"],
                                        hit["output_tokens"], cost_usd=0.0, cached=True,
                                        elapsed_s=time.perf_counter() - started)
                ledger.record(CallRecord(model, completion.input_tokens,
                                         completion.output_tokens, 0.0, cached=True,
                                         elapsed_s=completion.elapsed_s))
                return completion

        litellm = await load_litellm()
        messages = await redact_messages(messages, redactor or self.redactor())
        request = {"model": model, "messages": messages, "timeout": config.timeout,
                   # Retries are ours (backoff, jitter, counted in the ledger): stop the
                   # provider SDK from retrying underneath us.
                   "max_retries": 0, **params}
        if config.model_list:
            # The Router retries, on another deployment when it can (see routing.py).
            send, max_retries = self._router(litellm).acompletion, 0
            attempt_timeout = config.timeout * (config.max_retries + 1)
            if model not in routing.groups(config.model_list):
                raise self._failed(ledger, model, 0, 0, started, ConfigError(
                    f"{model!r} is not a model group of RLM.model_list (its groups: "
                    f"{', '.join(routing.groups(config.model_list))})"))
        else:
            send, max_retries, attempt_timeout = litellm.acompletion, config.max_retries, \
                config.timeout
            if config.api_base:
                request["api_base"] = config.api_base
            if config.api_key:
                request["api_key"] = config.api_key

        gate = self.gate(model)
        characters = sum(len(m["content"]) for m in messages
                         if isinstance(m.get("content"), str))
        tokens = gate.estimate_tokens(characters)
        retries = rate_limited = 0
        limited_since: float | None = None  # when this call first met a rate limit
        while True:
            deadline = (None if limited_since is None
                        else limited_since + config.rate_limit_wait)
            try:
                ticket = await gate.enter(tokens, deadline)
            except asyncio.CancelledError:
                _record_cancelled(ledger, model, retries, started, rate_limited)
                raise
            except RateLimitWaitExceeded as exc:
                raise self._rate_limit_failure(
                    ledger, model, retries, rate_limited, started, limited_since,
                    f"the provider's limit would hold it {exc.args[0]:.0f}s more") from None
            try:
                response = await asyncio.wait_for(send(**request), attempt_timeout)
            except asyncio.CancelledError:
                gate.failed(ticket)
                _record_cancelled(ledger, model, retries, started, rate_limited)
                raise
            except Exception as exc:  # noqa: BLE001 - every failure is reported below
                failure = exc
            else:
                usage = getattr(response, "usage", None)
                gate.answered(ticket, _response_headers(response),
                              getattr(usage, "prompt_tokens", None), characters)
                break
            if is_rate_limit(failure):
                # Not a failure: the gate holds this call (and every other call to this
                # endpoint) back until the provider's limit allows it, then it goes again.
                gate.rate_limited_by(ticket, headers_of(failure))
                rate_limited += 1
                limited_since = limited_since or ticket.sent_at
                if time.monotonic() - limited_since < config.rate_limit_wait:
                    continue
                raise self._rate_limit_failure(ledger, model, retries, rate_limited,
                                               started, limited_since,
                                               describe_exception(failure)) from failure
            gate.failed(ticket)
            if retries >= max_retries or not is_retryable(failure):
                if isinstance(failure, asyncio.TimeoutError):
                    failure = TimeoutError(f"no answer within {attempt_timeout:g}s")
                raise self._failed(ledger, model, retries, rate_limited, started,
                                   failure) from failure
            delay = random.uniform(0, config.retry_backoff * 2 ** retries)
            delay = max(delay, min(_retry_after(failure) or 0.0, 60.0))
            retries += 1
            try:
                await asyncio.sleep(delay)
            except asyncio.CancelledError:
                _record_cancelled(ledger, model, retries, started, rate_limited)
                raise

        completion = _completion_from(response, model, retries,
                                      time.perf_counter() - started, litellm)
        ledger.record(CallRecord(model, completion.input_tokens, completion.output_tokens,
                                 completion.cost_usd, retries=retries,
                                 rate_limited=rate_limited,
                                 elapsed_s=completion.elapsed_s))
        if key is not None:
            _cache_call(cache.set, key, {"text": completion.text,
                                         "input_tokens": completion.input_tokens,
                                         "output_tokens": completion.output_tokens})
        return completion


    def _failed(self, ledger: UsageLedger, model: str, retries: int, rate_limited: int,
                started: float, failure: BaseException) -> LLMQueryError:
        error = LLMQueryError(model, explain_proxy_failure(failure, model), retries=retries)
        ledger.record(CallRecord(model, retries=retries, error=str(error),
                                 rate_limited=rate_limited,
                                 elapsed_s=time.perf_counter() - started))
        return error

    def _rate_limit_failure(self, ledger: UsageLedger, model: str, retries: int,
                            rate_limited: int, started: float, limited_since: float,
                            why: str) -> LLMQueryError:
        waited = time.monotonic() - limited_since
        return self._failed(ledger, model, retries, rate_limited, started, RuntimeError(
            f"rate limited for {waited:.0f}s ({rate_limited} rate-limited responses), "
            f"past RLM.rate_limit_wait={self.config.rate_limit_wait:g}s; {why}"))


def _record_cancelled(ledger: UsageLedger, model: str, retries: int, started: float,
                      rate_limited: int = 0) -> None:
    # A cancelled call may already have been billed in part: it stays in the ledger.
    ledger.record(CallRecord(model, retries=retries, error="cancelled",
                             rate_limited=rate_limited,
                             elapsed_s=time.perf_counter() - started))


def _response_headers(response) -> dict | None:
    hidden = getattr(response, "_hidden_params", None) or {}
    return hidden.get("additional_headers")


def _cache_call(method, *args):
    """A cache that fails (disk full, locked) must not cost the user a paid answer:
    warn once and go on without it."""
    try:
        return method(*args)
    except Exception as exc:  # noqa: BLE001 - any storage error
        if not getattr(_cache_call, "warned", False):
            import warnings

            warnings.warn(f"rlm-magic cache is not working, going on without it: {exc}",
                          RuntimeWarning, stacklevel=2)
            _cache_call.warned = True
        return None


async def redact_messages(messages: Messages, redactor: Redactor) -> Messages:
    """Every message as it may be sent: with secrets removed. The last line of defence:
    whatever code built the prompt, no environment secret reaches a provider."""
    if not redactor:
        return messages

    def redact_all():
        return [{**m, "content": redactor(m["content"])} if isinstance(m.get("content"), str)
                else m for m in messages]

    size = sum(len(m.get("content") or "") for m in messages
               if isinstance(m.get("content"), str))
    return await off_loop_if_large(size, redact_all)


def _completion_from(response, model: str, retries: int, elapsed: float,
                     litellm) -> Completion:
    choice = response.choices[0]
    text = getattr(choice.message, "content", None) or ""
    usage = getattr(response, "usage", None)
    input_tokens = int(getattr(usage, "prompt_tokens", 0) or 0)
    output_tokens = int(getattr(usage, "completion_tokens", 0) or 0)
    return Completion(text, model, input_tokens, output_tokens,
                      cost_usd=_cost_of(response, litellm), retries=retries,
                      elapsed_s=elapsed)


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
        cost = _number((hidden.get("additional_headers") or {}).get(PROXY_COST_HEADER))
    return float(cost) if cost is not None else None


PROXY_COST_HEADER = "llm_provider-x-litellm-response-cost"


def _number(value) -> float | None:
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if number == number and number >= 0 else None  # not NaN, not negative


def explain_proxy_failure(failure: BaseException, model: str) -> BaseException | str:
    """A LiteLLM Proxy without a database answers an unknown key with a 400 "No connected
    db." (it would look the key up there): say what that means."""
    if model.startswith("litellm_proxy/") and "No connected db" in str(failure):
        return ("the LiteLLM Proxy rejected the API key: it is not the proxy's master "
                "key, and the proxy has no database to look other keys up in")
    return failure
