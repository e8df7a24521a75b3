"""The wire transport: OpenAI-compatible chat completions sent straight over aiohttp.

litellm spends ~4 ms of the loop's CPU on every call (logging, cost machinery, response
objects), twenty times what the HTTP exchange itself costs; with a few hundred answers a
second that saturates the kernel's loop. For endpoints that speak OpenAI's chat API
as-is, this module sends the request litellm would send and reads the answer with a
few dictionary lookups. Everything else (the gate, retries, the ledger, the cache,
redaction) stays in ``client``; errors are raised as classes with litellm's names,
status codes and headers, so ``client`` classifies and words them the same way.

Which endpoints (``route_for`` decides once per model and endpoint, with litellm's own
provider resolution, and says None for everything else, which then goes through litellm):

- ``openai/...`` and OpenAI's bare model names (``gpt-4o-mini``), at ``RLM.api_base`` (any
  OpenAI-compatible server: llama.cpp, vLLM, Ollama's ``/v1``, LM Studio...) or OpenAI's;
- ``hosted_vllm/...`` and ``litellm_proxy/...``.

Not here, through litellm: models whose request litellm rewrites (OpenAI's o-series and
gpt-5 take ``max_completion_tokens`` and refuse some parameters), Azure (deployment
URLs, api-version, AD tokens), OpenRouter (its own headers and usage options), every
other provider, and ``RLM.litellm_kwargs`` holding anything but OpenAI's own chat
parameters. litellm stays loaded for prices, token counts and model info; its price
map is read once per model, not per call.
"""

from __future__ import annotations

import asyncio
import json
import os
import weakref
from dataclasses import dataclass

from .transport import Answer

# litellm's chat configuration classes that send OpenAI's request unchanged.
_PLAIN_CONFIGS = {
    "OpenAIGPTConfig",
    "OpenAIUnknownModelConfig",
    "HostedVLLMChatConfig",
    "LiteLLMProxyChatConfig",
}
# Where each provider's endpoint and key come from when the settings leave them out
# (litellm's order: the argument, then these environment variables, then a default).
_BASES = {
    "openai": (("OPENAI_BASE_URL", "OPENAI_API_BASE"), "https://api.openai.com/v1"),
    "hosted_vllm": (("HOSTED_VLLM_API_BASE",), None),
    "litellm_proxy": (("LITELLM_PROXY_API_BASE",), None),
}
_KEYS = {
    "openai": ("OPENAI_API_KEY",),
    "hosted_vllm": ("HOSTED_VLLM_API_KEY",),
    "litellm_proxy": ("LITELLM_PROXY_API_KEY",),
}
# Request parameters OpenAI's chat API takes as they are (what may be in litellm_kwargs).
CHAT_PARAMETERS = frozenset(
    {
        "temperature",
        "top_p",
        "n",
        "stop",
        "presence_penalty",
        "frequency_penalty",
        "logit_bias",
        "seed",
        "user",
        "response_format",
        "tools",
        "tool_choice",
        "parallel_tool_calls",
        "logprobs",
        "top_logprobs",
        "store",
        "metadata",
        "prediction",
        "service_tier",
        "reasoning_effort",
        "verbosity",
        "max_tokens",
        "extra_headers",
        "extra_body",
    }
)
# What rlm-magic itself puts in a request besides the messages and parameters.
_OWN = frozenset(
    {
        "model",
        "messages",
        "timeout",
        "max_retries",
        "api_base",
        "api_key",
        "stream",
        "stream_options",
    }
)
PROXY_COST_HEADER = "x-litellm-response-cost"


def fits(params: dict) -> bool:
    """Whether a request with these extra parameters can go over the wire unchanged."""
    return all(name in CHAT_PARAMETERS or name in _OWN for name in params)


# -- routes ----------------------------------------------------------------------------


@dataclass
class Route:
    """Where one model's requests go and how they are priced."""

    model: str  # as configured, e.g. "openai/gpt-4o-mini"
    provider: str
    sent_model: str  # as the endpoint knows it, e.g. "gpt-4o-mini"
    url: str
    api_base: str
    headers: dict[str, str]
    price_names: tuple[str, ...]  # where litellm's price map may list this model
    proxy: str | None = None  # from HTTP(S)_PROXY / NO_PROXY, as litellm's clients


_ROUTES: dict[tuple, Route | None] = {}
# The environment a route may be read from: a change (a key set later) resolves anew.
_ENVIRONMENT = tuple(
    name for names in (*(b for b, _ in _BASES.values()), *_KEYS.values()) for name in names
) + ("OPENAI_ORGANIZATION", "OPENAI_ORG_ID", "OPENAI_PROJECT_ID")


def route_for(litellm, model: str, api_base: str | None, api_key: str | None) -> Route | None:
    """The wire route for ``model`` at this endpoint, or None: litellm sends it."""
    get = os.environ.get
    headers = getattr(litellm, "headers", None)
    # litellm's module-wide settings too: one set mid-session must not keep the old route.
    where = (
        model,
        api_base,
        api_key,
        getattr(litellm, "api_key", None),
        getattr(litellm, "api_base", None),
        repr(headers) if headers else None,
        *(get(name) for name in _ENVIRONMENT),
    )
    route = _ROUTES.get(where, _ROUTES)
    if route is _ROUTES:
        route = _ROUTES[where] = _resolve(litellm, model, api_base, api_key)
    return route


def _env_key(provider: str) -> str | None:
    return next((os.environ[n] for n in _KEYS.get(provider, ()) if os.environ.get(n)), None)


def _resolve(litellm, model, api_base, api_key) -> Route | None:
    try:
        name, provider, _, _ = litellm.get_llm_provider(model, api_base=api_base)
        from litellm.types.utils import LlmProviders
        from litellm.utils import ProviderConfigManager

        config = ProviderConfigManager.get_provider_chat_config(name, LlmProviders(provider))
    except Exception:  # noqa: BLE001 - litellm will say what is wrong, in its words
        return None
    if provider not in _BASES or type(config).__name__ not in _PLAIN_CONFIGS:
        return None
    if getattr(litellm, "api_base", None) or getattr(litellm, "headers", None):
        return None  # litellm's module-wide settings: leave those calls to litellm
    env_names, default = _BASES[provider]
    base = api_base or next((os.environ[n] for n in env_names if os.environ.get(n)), default)
    key = api_key or getattr(litellm, "api_key", None) or _env_key(provider)
    if provider == "hosted_vllm":
        key = key or "fake-api-key"  # as litellm sends it
    if base is None or (provider == "openai" and not key):
        return None  # litellm raises its own one-line error for a missing key or base
    headers = {"Content-Type": "application/json"}
    if key:
        headers["Authorization"] = f"Bearer {key}"
    if provider == "openai":
        organization = os.environ.get("OPENAI_ORGANIZATION") or os.environ.get("OPENAI_ORG_ID")
        if organization:
            headers["OpenAI-Organization"] = organization
        if os.environ.get("OPENAI_PROJECT_ID"):
            headers["OpenAI-Project"] = os.environ["OPENAI_PROJECT_ID"]
    base = base.rstrip("/")
    price_names = (model, f"{provider}/{name}") + ((name,) if provider == "openai" else ())
    return Route(
        model,
        provider,
        name,
        base + "/chat/completions",
        base,
        headers,
        price_names,
        proxy=_proxy_for(base),
    )


def _proxy_for(url: str) -> str | None:
    """The proxy the environment names for ``url``. Read once per route: aiohttp's own
    ``trust_env`` would look it (and ~/.netrc) up in a thread on every request."""
    from urllib.parse import urlsplit
    from urllib.request import getproxies, proxy_bypass

    parts = urlsplit(url)
    proxy = getproxies().get(parts.scheme)
    if not proxy or (parts.hostname and proxy_bypass(parts.hostname)):
        return None
    return proxy


def price_entry(litellm, route: Route) -> dict | None:
    """The model's entry in litellm's price map, looked up at each answer (a few
    dictionary lookups; prices registered meanwhile count): pricing each call through
    litellm's cost machinery would cost ~0.15 ms of CPU."""
    cost = litellm.model_cost
    for name in route.price_names:
        entry = cost.get(name)
        if entry is not None:
            return entry if isinstance(entry.get("input_cost_per_token"), (int, float)) else None
    return None


def forget_routes() -> None:
    """Resolve every route again (prices or environment changed)."""
    _ROUTES.clear()


# -- sessions, one per loop ------------------------------------------------------------

_SESSIONS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _session():
    """This loop's aiohttp session: its connections belong to the loop that made them."""
    loop = asyncio.get_running_loop()
    entry = _SESSIONS.get(loop)
    if entry is None or entry[0].closed:
        import aiohttp

        connector = aiohttp.TCPConnector(limit=0, ssl=ssl_context(), ttl_dns_cache=300)
        session = aiohttp.ClientSession(
            connector=connector,  # proxies: per route (``Route.proxy``)
            timeout=aiohttp.ClientTimeout(total=None),  # ours: wait_for, the stall watch
            json_serialize=json.dumps,
        )
        closer = _closed_with_loop(loop, session)
        try:  # started, so the loop knows it: asyncio.run closes it when the loop ends
            closer.__anext__().send(None)
        except StopIteration:
            pass
        _SESSIONS[loop] = entry = (session, closer)
    return entry[0]


async def _closed_with_loop(loop, session):
    """Closes ``session`` when its loop shuts down (``asyncio.run`` closes every open
    async generator then), for scripts that never call ``close_loop_clients``: an
    unclosed session would complain at exit, and keep its loop alive until then."""
    try:
        yield
    finally:
        if _SESSIONS.get(loop, (None,))[0] is session:
            del _SESSIONS[loop]
        if not session.closed:
            await session.close()


def ssl_context():
    """litellm's SSL settings (``SSL_CERT_FILE``, ``litellm.ssl_verify``, certifi); litellm
    caches the context, so only the first call loads certificates."""
    try:
        from litellm.llms.custom_httpx.http_handler import get_ssl_configuration

        return get_ssl_configuration()
    except Exception:  # noqa: BLE001 - aiohttp's default context
        return True


async def close_sessions() -> None:
    """Close the running loop's session (before the loop ends)."""
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        return
    entry = _SESSIONS.pop(loop, None)
    if entry is not None:
        await entry[1].aclose()  # closes the session
        # The sockets close in the loop's next turns: a loop that ends now (asyncio.run)
        # would never run them, and each run would leave its connections open.
        await asyncio.sleep(0)
        await asyncio.sleep(0)


# -- errors, as litellm names them ------------------------------------------------------


class _Response:
    def __init__(self, headers):
        self.headers = headers


class WireError(Exception):
    """An HTTP failure, with the status and headers the client's checks read."""

    def __init__(
        self,
        message: str,
        status_code: int | None = None,
        headers=None,
        api_base: str | None = None,
    ):
        super().__init__(message)
        self.message, self.status_code, self.api_base = message, status_code, api_base
        self.litellm_response_headers = headers
        self.response = _Response(headers or {})


class BadRequestError(WireError): ...


class ContextWindowExceededError(BadRequestError): ...


class AuthenticationError(WireError): ...


class PermissionDeniedError(WireError): ...


class NotFoundError(WireError): ...


class Timeout(WireError): ...


class UnprocessableEntityError(BadRequestError): ...


class RateLimitError(WireError): ...


class InternalServerError(WireError): ...


class ServiceUnavailableError(WireError): ...


class APIError(WireError): ...


class APIConnectionError(WireError): ...


_BY_STATUS = {
    400: BadRequestError,
    401: AuthenticationError,
    403: PermissionDeniedError,
    404: NotFoundError,
    408: Timeout,
    422: UnprocessableEntityError,
    429: RateLimitError,
    500: InternalServerError,
    503: ServiceUnavailableError,
}
# litellm's list of what providers say when a prompt is over the window.
_CONTEXT_PHRASES = (
    "exceed context limit",
    "this model's maximum context length is",
    "requested token count exceeds the model's maximum context length",
    "model's maximum context limit",
    "is longer than the model's context length",
    "input tokens exceed the configured limit",
    "exceeds the available context size",
    "exceeds the maximum number of tokens allowed",
    '"code": "context_length_exceeded"',
    "context_length_exceeded",
    "prompt is too long",
)


def error_for(status: int, body: bytes, headers, api_base: str) -> WireError:
    """The exception litellm would raise for this HTTP answer, with the provider's
    own sentence as its message."""
    message = _message_of(body) or f"Error code: {status}"
    lowered = message.lower()
    if status in (400, 413) and any(p in lowered for p in _CONTEXT_PHRASES):
        kind = ContextWindowExceededError
    else:
        kind = _BY_STATUS.get(status, APIError)
    return kind(message, status, headers, api_base)


# The HTTP status an error object's own code or type stands for (a stream's error event
# comes inside a 200 answer).
_STATUS_OF_KIND = {
    "invalid_request_error": 400,
    "context_length_exceeded": 400,
    "bad_request": 400,
    "authentication_error": 401,
    "invalid_api_key": 401,
    "permission_error": 403,
    "permission_denied": 403,
    "not_found_error": 404,
    "model_not_found": 404,
    "rate_limit_error": 429,
    "rate_limit_exceeded": 429,
    "insufficient_quota": 429,
    "overloaded_error": 503,
    "service_unavailable": 503,
    "server_error": 500,
}


def event_error(event: dict, headers, api_base: str) -> WireError:
    """The exception for an error event inside a stream, by the error's own code or
    type, as ``error_for`` reads an HTTP error (a prompt over the window included)."""
    error = event.get("error")
    status = None
    if isinstance(error, dict):
        for field in ("code", "status", "type"):
            value = error.get(field)
            if isinstance(value, int) or (isinstance(value, str) and value.isdigit()):
                status = int(value)
            elif isinstance(value, str):
                status = _STATUS_OF_KIND.get(value.lower())
            if status is not None and 300 <= status < 600:
                break
            status = None
    return error_for(status or 500, json.dumps(event).encode(), headers, api_base)


def redirect_error(status: int, headers, api_base: str) -> APIError:
    """A chat request is never sent on to where a redirect points: its headers (keys)
    and prompt would go to another host."""
    from urllib.parse import urlsplit

    location = (headers or {}).get("Location") or ""
    host = urlsplit(location).hostname or location or "nowhere named"
    return APIError(
        f"the endpoint answered with a redirect ({status}) to {host}; "
        "chat requests are not sent on: set api_base to the endpoint's "
        "own address",
        status,
        headers,
        api_base,
    )


def _message_of(body: bytes) -> str:
    text = body.decode("utf-8", "replace").strip()
    try:
        data = json.loads(text)
    except ValueError:
        return ""  # a page, not an error object: litellm says "Error code: N" too
    if isinstance(data, dict):
        error = data.get("error", data)
        if isinstance(error, dict):
            found = error.get("message") or error.get("detail")
            if found:
                return str(found)
        elif isinstance(error, str):
            return error
        if data.get("detail"):
            return str(data["detail"])
    return text[:1000]


def connection_error(exc: BaseException, api_base: str) -> APIConnectionError:
    return APIConnectionError(str(exc) or type(exc).__name__, None, None, api_base)


# litellm's words for a stream that ended cleanly before its end (a finish reason).
STREAM_ENDED = "Stream ended before a finish_reason was received"
# Above any real event (a server that sends a whole answer as one event included), and
# a bound on what one stream may make the kernel hold: past it, a broken (or hostile)
# stream, not an answer.
MAX_LINE = 16 << 20
# Prompts counted off the loop above this many characters (usage missing).
_LARGE_CHARS = 50_000


def _completion_parts(raw: bytes, headers, api_base: str) -> tuple[str, object, object]:
    """(text, finish reason, usage) of an unstreamed chat completion's body."""
    try:
        data = json.loads(raw)
        if isinstance(data, dict) and "error" in data and "choices" not in data:
            raise event_error(data, headers, api_base)  # an error said with a 200
        choice = data["choices"][0]
        text = (choice.get("message") or {}).get("content") or ""
        return text, choice.get("finish_reason"), data.get("usage")
    except (ValueError, KeyError, IndexError, TypeError, AttributeError):
        raise APIError(
            f"the endpoint's answer is not a chat completion: "
            f"{raw[:200].decode('utf-8', 'replace')}",
            502,
            headers,
            api_base,
        ) from None


_FINISH: dict = {"stop": "stop", "length": "length", None: None}


def finish_reason_of(reason):
    """The finish reason as litellm reports it (``max_tokens`` is "length",
    ``eos_token`` "stop"...), by litellm's own table; remembered per word."""
    try:
        known = _FINISH.get(reason, _FINISH)
    except TypeError:  # not a word at all (a broken server's list or object)
        return None
    if known is _FINISH:
        try:
            from litellm.litellm_core_utils.core_helpers import map_finish_reason

            known = map_finish_reason(reason)
        except Exception:  # noqa: BLE001 - as it came
            known = reason
        if len(_FINISH) < 256:
            _FINISH[reason] = known
    return known


# -- the transport ---------------------------------------------------------------------


class WireTransport:
    """Sends one route's requests; ``complete`` and ``stream`` as ``transport`` says."""

    name = "wire"

    def __init__(self, route: Route, litellm):
        self.route = route
        self._litellm = litellm  # for token counts when a provider sends no usage

    def body(self, request: dict) -> tuple[dict, dict]:
        """The JSON body and the headers of ``request`` (our request dict)."""
        route = self.route
        body = {"model": route.sent_model}
        headers = route.headers
        for name, value in request.items():
            if name in ("model", "timeout", "max_retries", "api_base", "api_key"):
                continue
            if name == "extra_headers":
                headers = {**headers, **(value or {})}
            elif name == "extra_body":
                body.update(value or {})
            else:
                body[name] = value
        return body, headers

    async def complete(self, request: dict, messages=None) -> Answer:
        import aiohttp

        body, headers = self.body(request)
        route = self.route
        try:
            async with _session().post(
                route.url, json=body, headers=headers, proxy=route.proxy, allow_redirects=False
            ) as reply:
                raw = await reply.read()
                status, received = reply.status, reply.headers
        except aiohttp.ClientError as exc:
            raise connection_error(exc, route.api_base) from exc
        if status >= 400:
            raise error_for(status, raw, received, route.api_base)
        if status >= 300:
            raise redirect_error(status, received, route.api_base)
        text, finish, usage = _completion_parts(raw, received, route.api_base)
        messages = messages or request.get("messages")
        if not usage:
            return await self._counted_answer(text, finish, received, messages)
        return self._answer(text, finish, usage, received, messages)

    async def stream(
        self, request: dict, state, *, stall_timeout: float, deadline: float | None, messages=None
    ) -> Answer:
        from .streaming import stream_completion

        wire = await stream_completion(
            self._open, request, state, stall_timeout=stall_timeout, deadline=deadline
        )
        messages = messages or request.get("messages")
        if not state.usage:
            return await self._counted_answer(
                state.text, state.finish_reason, wire.headers, messages
            )
        return self._answer(state.text, state.finish_reason, state.usage, wire.headers, messages)

    def partial(self, state, messages) -> Answer | None:
        """What a cut-off stream received, priced (it is billed all the same)."""
        if state is None or not state.received:
            return None
        return self._answer(state.text, state.finish_reason, state.usage, None, messages)

    async def _open(self, **request) -> _WireStream:
        import aiohttp

        request.pop("timeout", None)  # the stall watch times a stream
        body, headers = self.body(request)
        route = self.route
        try:
            reply = await _session().post(
                route.url, json=body, headers=headers, proxy=route.proxy, allow_redirects=False
            )
        except aiohttp.ClientError as exc:
            raise connection_error(exc, route.api_base) from exc
        if reply.status >= 300:
            try:
                raw = await reply.read()
            finally:
                reply.release()
            if reply.status < 400:
                raise redirect_error(reply.status, reply.headers, route.api_base)
            raise error_for(reply.status, raw, reply.headers, route.api_base)
        return _WireStream(reply, route.api_base)

    async def _counted_answer(self, text: str, finish_reason, headers, messages) -> Answer:
        """The answer of a provider that sent no usage: its tokens counted as litellm
        counts them, a large prompt in a thread (the loop stays free)."""
        if _characters(messages) > _LARGE_CHARS:
            counts = await asyncio.to_thread(self._count, messages, text)
        else:
            counts = self._count(messages, text)
        return self._answer(text, finish_reason, None, headers, messages, counts)

    def _answer(
        self,
        text: str,
        finish_reason,
        usage,
        headers,
        messages,
        counts: tuple[int, int] | None = None,
    ) -> Answer:
        if usage:
            get = usage.get
            details = get("prompt_tokens_details") or {}
            input_tokens = int(get("prompt_tokens") or 0)
            output_tokens = int(get("completion_tokens") or 0)
            read = int(details.get("cached_tokens") or get("cache_read_input_tokens") or 0)
            written = int(
                get("cache_creation_input_tokens") or details.get("cache_creation_tokens") or 0
            )
        else:  # counted as litellm does when a provider leaves usage out
            input_tokens, output_tokens = counts or self._counts_on_loop(messages, text)
            read = written = 0
        cost = self._cost(input_tokens, output_tokens, read, written, headers)
        if cost is None and usage:
            # A LiteLLM Proxy puts its price of a streamed answer in the usage.
            from .ratelimit import non_negative

            cost = non_negative(usage.get("cost"))
        return Answer(
            text,
            finish_reason_of(finish_reason),
            input_tokens,
            output_tokens,
            read,
            written,
            cost,
            headers,
        )

    def _counts_on_loop(self, messages, text: str) -> tuple[int, int]:
        """Counts for a cut-off answer (``partial``, which cannot wait for a thread):
        litellm's for a small prompt, the characters' estimate for a large one."""
        if _characters(messages) <= _LARGE_CHARS:
            return self._count(messages, text)
        from . import windows

        model = self.route.model
        return (
            windows.estimate_tokens(messages or [], model),
            round(len(text) / windows.chars_per_token(model)),
        )

    def _count(self, messages, text: str) -> tuple[int, int]:
        litellm, model = self._litellm, self.route.model
        try:
            prompt = litellm.token_counter(model=model, messages=messages or [])
            output = litellm.token_counter(model=model, text=text) if text else 0
            return int(prompt), int(output)
        except Exception:  # noqa: BLE001 - no tokenizer: about 4 characters a token
            return max(1, _characters(messages) // 4), len(text) // 4

    def _cost(self, input_tokens, output_tokens, read, written, headers) -> float | None:
        route = self.route
        entry = price_entry(self._litellm, route)
        if entry is not None and not _tiered(entry):
            base = entry["input_cost_per_token"]
            output = entry.get("output_cost_per_token") or 0.0
            read_price = entry.get("cache_read_input_token_cost")
            write_price = entry.get("cache_creation_input_token_cost")
            return (
                (input_tokens - read - written) * base
                + read * (base if read_price is None else read_price)
                + written * (base if write_price is None else write_price)
                + output_tokens * output
            )
        if entry is not None:  # priced by the prompt's size: litellm knows the tiers
            try:
                prompt, completion = self._litellm.cost_per_token(
                    model=route.model,
                    prompt_tokens=input_tokens,
                    completion_tokens=output_tokens,
                    cache_read_input_tokens=read,
                )
                return prompt + completion
            except Exception:  # noqa: BLE001 - then the proxy's word, or unknown
                pass
        # A LiteLLM Proxy prices the call with its upstream's price and says so.
        from .ratelimit import non_negative

        cost = non_negative((headers or {}).get(PROXY_COST_HEADER)) if headers else None
        return float(cost) if cost is not None else None


def _characters(messages) -> int:
    return sum(
        len(m["content"])
        for m in messages or ()
        if isinstance(m, dict) and isinstance(m.get("content"), str)
    )


_TIERED: dict[int, tuple[dict, bool]] = {}


def _tiered(entry: dict) -> bool:
    """Whether a price depends on the prompt's size (``..._above_128k_tokens``)."""
    known = _TIERED.get(id(entry))
    if known is None or known[0] is not entry:
        known = _TIERED[id(entry)] = (entry, any("above_" in key for key in entry))
    return known[1]


class _WireStream:
    """An open server-sent-events answer, read in network-sized pieces: each piece is
    split into events and each event's text handed on, with no object per chunk."""

    def __init__(self, reply, api_base: str):
        self.reply, self.headers, self.api_base = reply, reply.headers, api_base
        self.done = False

    async def pump(self, state, touch) -> None:
        import aiohttp

        try:
            if self.reply.content_type == "application/json":
                # A server that ignores ``stream``: its whole answer at once.
                raw = await self.reply.read()
                touch()
                text, state.finish, state.usage = _completion_parts(
                    raw, self.headers, self.api_base
                )
                if text:
                    state.add_text(text)
                self.done = True
                return
            await self._events(state, touch)
        except aiohttp.ClientError as exc:
            raise connection_error(exc, self.api_base) from exc
        except (ValueError, AttributeError, TypeError, KeyError, IndexError) as exc:
            # An event that is no chunk (bad JSON, ``data: 1``): litellm's connection
            # error, so the call is retried.
            raise APIConnectionError(
                f"the endpoint sent a malformed stream event "
                f"({type(exc).__name__}: {str(exc)[:200]})",
                None,
                self.headers,
                self.api_base,
            ) from None
        if not self.done and state.finish is None:
            raise APIConnectionError(STREAM_ENDED, None, self.headers, self.api_base)

    async def _events(self, state, touch) -> None:
        loads, add = json.loads, state.add_text
        # A line's pieces until its newline comes: each byte is joined and split once
        # (a long line is not copied again with every read), and a line is bounded.
        pending: list[bytes] = []
        pending_size = 0
        async for data in self.reply.content.iter_any():
            touch()
            if pending:  # a line began in an earlier read
                pending.append(data)
                pending_size += len(data)
                if b"\n" not in data:
                    if pending_size > MAX_LINE:
                        raise self._too_long()
                    continue
                data = b"".join(pending)
                pending = []
            lines = data.split(b"\n")
            rest = lines.pop()
            if rest:
                pending.append(rest)
                pending_size = len(rest)
                if pending_size > MAX_LINE:
                    raise self._too_long()
            for line in lines:
                if not line.startswith(b"data:"):
                    continue
                payload = line[5:].strip()
                if payload == b"[DONE]":
                    self.done = True
                    return
                event = loads(payload)
                choices = event.get("choices")
                if choices:
                    choice = choices[0]
                    delta = choice.get("delta")
                    if delta:
                        piece = delta.get("content")
                        if piece:
                            add(piece)
                    if choice.get("finish_reason"):
                        state.finish = choice["finish_reason"]
                if event.get("usage"):
                    state.usage = event["usage"]
                if "error" in event:
                    raise event_error(event, self.headers, self.api_base)

    def _too_long(self) -> APIConnectionError:
        return APIConnectionError(
            f"the endpoint sent a stream line over {MAX_LINE} bytes",
            None,
            self.headers,
            self.api_base,
        )

    async def aclose(self) -> None:
        if self.done:
            self.reply.release()  # the connection goes back to the pool
        else:
            self.reply.close()  # mid-answer: drop it, so the server stops generating
