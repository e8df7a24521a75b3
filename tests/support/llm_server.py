"""A local OpenAI-compatible chat server for tests and benchmarks.

It speaks the same wire format as the demo model (``rlm_magic.demo.LocalChatServer``)
and runs in a thread with its own event loop on 127.0.0.1, so tests on any loop, or a
kernel in another process, reach it over real HTTP. It scripts replies per model, adds
latency, injects failures (500, 429, 401, a hang) and records every request and the
peak number in flight. Like a real provider it can also enforce rate limits (requests
and tokens per second, token buckets), answering excess requests with 429,
``retry-after`` and OpenAI's ``x-ratelimit-*`` headers.

It streams (server-sent events, a delay between chunks, usage in the last chunk), speaks
enough of Anthropic's Messages API (``/v1/messages``, plain and streamed) for litellm's
``anthropic/`` provider, and plays a provider's prompt cache: Anthropic's, which serves
prefixes that an earlier request marked with ``cache_control``, and OpenAI's automatic
one, which serves any repeated prefix of whole messages.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import math
import threading
import time
import weakref
from collections import defaultdict, deque
from collections.abc import Callable
from dataclasses import dataclass

from rlm_magic.demo import HTTPError, LocalChatServer, completion_json, split_tokens

Reply = str | Callable[[dict], str]

_FAILURES = {
    "500": (500, "injected server error", "server_error"),
    "429": (429, "injected rate limit", "rate_limit_error"),
    "401": (401, "injected bad API key", "invalid_request_error"),
    # A provider whose refusal quotes the key it was sent (ECHOED_KEY: use it as api_key)
    "401-echo": (
        401,
        "Incorrect API key provided: Bearer sk-echoed-0123456789abcdef",
        "invalid_request_error",
    ),
    # llama.cpp's answer to a prompt over its context size
    "context": (
        400,
        "request (23009 tokens) exceeds the available context size (4096 "
        "tokens), try increasing it",
        "exceed_context_size_error",
    ),
    # A provider that knows no prompt-cache markers, in the words such servers use.
    "400-stream": (
        400,
        "stream: streaming is not supported by this model",
        "invalid_request_error",
    ),
    "400-markers": (
        400,
        "messages.0.content: cache_control: Extra inputs are not permitted",
        "invalid_request_error",
    ),
}


def prompt_tokens(body: dict) -> int:
    """Tokens of a request's prompt as this server counts them: ~4 characters each."""
    return max(1, sum(len(m.get("content") or "") for m in body.get("messages", [])) // 4)


def echo(request: dict) -> str:
    """Default reply: 'echo: ' + the last user message."""
    return "echo: " + request["messages"][-1]["content"]


@dataclass
class Failure:
    kind: str  # "500", "429", "401", "context", "hang"
    times: int
    model: str | None = None
    match: str | None = None  # fail only requests whose last message contains this
    after: int = 0  # let this many matching requests through first
    headers: dict[str, str] | None = None  # e.g. a 429's retry-after

    def applies(self, body: dict) -> bool:
        if self.model is not None and body.get("model") != self.model:
            return False
        if self.match is not None and self.match not in body["messages"][-1]["content"]:
            return False
        if self.after > 0:
            self.after -= 1
            return False
        return True


class TokenBucket:
    """A provider's limit: ``capacity`` at most, refilled at ``rate`` per second."""

    def __init__(self, rate: float, capacity: float):
        self.rate, self.capacity, self.level = rate, capacity, capacity
        self.stamp = time.monotonic()

    def refill(self, now: float) -> None:
        self.level = min(self.capacity, self.level + (now - self.stamp) * self.rate)
        self.stamp = now

    def seconds_until(self, amount: float) -> float:
        return max(0.0, (min(amount, self.capacity) - self.level) / self.rate)

    def headers(self, kind: str, announced: float | None = None) -> dict[str, str]:
        """OpenAI's spelling: the limit, what remains, and when it is full again.
        ``announced``: a quantized limit, which names the minute's budget while the
        remaining count and the reset are the small bucket's."""
        reset = (self.capacity - self.level) / self.rate
        return {
            f"x-ratelimit-limit-{kind}": str(int(announced or self.capacity)),
            f"x-ratelimit-remaining-{kind}": str(max(0, int(self.level))),
            f"x-ratelimit-reset-{kind}": f"{reset * 1000:.0f}ms" if reset < 1 else f"{reset:.3f}s",
        }


@dataclass
class RateLimit:
    requests: TokenBucket | None
    tokens: TokenBucket | None
    headers: str  # "all", "retry-after" (only that) or "none"
    # Quantized limits: per-minute budgets the headers announce, e.g. {"requests": 3000}.
    announced: dict[str, float] | None = None
    # The sentence of the last refusal (a 429's error message).
    refusal = "Rate limit reached for requests"

    def admit(self, cost: int) -> tuple[bool, dict[str, str]]:
        """Take one request of ``cost`` tokens, or say how long to wait (as a 429's
        headers would)."""
        now = time.monotonic()
        wait = 0.0
        for bucket, amount in ((self.requests, 1), (self.tokens, cost)):
            if bucket is not None:
                bucket.refill(now)
                wait = max(wait, bucket.seconds_until(amount))
        admitted = wait == 0.0
        if admitted:
            for bucket, amount in ((self.requests, 1), (self.tokens, cost)):
                if bucket is not None:
                    bucket.level -= amount
        headers: dict[str, str] = {}
        if self.headers == "all":
            for bucket, kind in ((self.requests, "requests"), (self.tokens, "tokens")):
                if bucket is not None:
                    headers.update(bucket.headers(kind, (self.announced or {}).get(kind)))
        if not admitted and self.headers != "none":
            headers["retry-after-ms"] = str(math.ceil(wait * 1000))
            headers["retry-after"] = str(math.ceil(wait))
        return admitted, headers


# -- a server that closes kept-alive connections (issue 28, connections reused safely) -----
class _ClosesConnections:
    """Modes of a server that ends kept-alive connections as real ones do, without a
    ``Connection: close`` to warn the client (llama.cpp, uvicorn and proxies close idle
    connections after a few seconds; some servers after so many answers):

    - ``close_every``: the connection is closed right after every Nth answer sent on it
      (streamed or not), so a client that reuses it at once writes into a closed socket;
    - ``close_idle_after(seconds)``: connections opened from now on are closed when idle
      that long (aiohttp's own keep-alive timeout, 3,630 s by default).

    ``connections`` counts the connections the server accepted, ``closed_by_server`` the
    ones it closed this way."""

    def _reset_closing_modes(self) -> None:
        self.close_every: int | None = None
        self.connections = 0
        self.closed_by_server = 0
        self._answers_on: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self.close_idle_after(None)

    def close_idle_after(self, seconds: float | None) -> None:
        runner = getattr(self, "_runner", None)
        server = getattr(runner, "server", None)
        if server is not None:  # read by each new connection's handler
            server._kwargs["keepalive_timeout"] = 3630 if seconds is None else seconds

    async def _chat(self, request):
        transport = request.transport
        if transport is not None and transport not in self._answers_on:
            self._answers_on[transport] = 0
            self.connections += 1
        response = await super()._chat(request)  # type: ignore[misc]
        every = self.close_every
        if every and transport is not None and not transport.is_closing():
            self._answers_on[transport] += 1
            if self._answers_on[transport] % every == 0:
                if not response.prepared:
                    await response.prepare(request)
                await response.write_eof()  # the answer goes out whole, then the close
                transport.close()
                self.closed_by_server += 1
        return response


# -- limits announced per minute, as OpenAI announces them (issue 28: token buckets) -------


@dataclass
class MinuteBudgetLimit(RateLimit):
    """Per-second buckets enforced, while the headers speak of the minute, as OpenAI's do:
    ``limit`` is the minute's budget (60 times the rate), ``remaining`` what is left of
    it, ``reset`` the time until it is whole again. They tell the true rate but not the
    small burst that is enforced. ``token_factor``: this server counts a prompt's tokens
    as that many times ~4 characters a token (another tokenizer). A refusal says so in
    OpenAI's words, with what the request counted ("Requested 3000")."""

    token_factor: float = 1.0
    minute: dict[str, TokenBucket] | None = None

    def admit(self, cost: int) -> tuple[bool, dict[str, str]]:
        cost = max(1, round(cost * self.token_factor))
        admitted, headers = super().admit(cost)
        now = time.monotonic()
        if not admitted:  # (the buckets were refilled to now, and not charged)
            short = self.tokens is not None and self.tokens.seconds_until(cost) > 0
            self.refusal = self._openai_s_sentence("tokens" if short else "requests", cost)
        for kind, bucket, amount in (("requests", self.requests, 1), ("tokens", self.tokens, cost)):
            budget = (self.minute or {}).get(kind)
            if bucket is None or budget is None:
                continue
            budget.refill(now)
            if admitted:
                budget.level -= amount
            if self.headers == "all":
                headers.update(budget.headers(kind))
        return admitted, headers

    def _openai_s_sentence(self, kind: str, cost: int) -> str:
        """OpenAI's words for a refusal, with the minute budget's figures and what this
        request counted ("Requested"), e.g. "Rate limit reached for gpt-4o in
        organization org-... on tokens per min (TPM): Limit 30000, Used 27000,
        Requested 4000. Please try again in 2s." (Here the refusal may come from the
        smaller bucket enforced, while the minute still has room.)"""
        budget = (self.minute or {}).get(kind)
        enforced = self.tokens if kind == "tokens" else self.requests
        requested = cost if kind == "tokens" else 1
        used = int(budget.capacity - budget.level) if budget else 0
        limit = int(budget.capacity) if budget else 0
        wait = enforced.seconds_until(requested) if enforced else 0.0
        again = f"{wait * 1000:.0f}ms" if wait < 1 else f"{wait:.3f}s"
        per_min = "tokens per min (TPM)" if kind == "tokens" else "requests per min (RPM)"
        return (
            f"Rate limit reached for model in organization org-local on {per_min}: "
            f"Limit {limit}, Used {used}, Requested {requested}. Please try again in {again}."
        )


def minute_budget_limit(
    rps: float | None,
    burst: float | None,
    tps: float | None,
    token_burst: float | None,
    token_factor: float = 1.0,
    headers: str = "all",
) -> MinuteBudgetLimit:
    minute = {
        kind: TokenBucket(rate, 60 * rate)
        for kind, rate in (("requests", rps), ("tokens", tps))
        if rate
    }
    return MinuteBudgetLimit(
        TokenBucket(rps, burst or rps) if rps else None,
        TokenBucket(tps, token_burst or tps) if tps else None,
        headers,
        None,
        token_factor,
        minute,
    )


class FakeLLMServer(_ClosesConnections, LocalChatServer):
    def __init__(self, host: str = "127.0.0.1", port: int = 0):
        super().__init__(host, port)
        self._lock = threading.Lock()
        self.reset()

    # -- control ------------------------------------------------------------------------
    def reset(self) -> None:
        with self._lock:
            self.latency: float = 0.0
            self.model_latency: dict[str, float] = {}
            self.latency_for: Callable[[dict], float] | None = None
            self.scripts: dict[str, deque] = defaultdict(deque)
            self.default_reply: Reply = echo
            self.model_replies: dict[str, Reply] = {}
            self.failures: list[Failure] = []
            self.requests: list[dict] = []
            self.arrivals: list[float] = []  # time.monotonic() of each request
            self.in_flight = 0
            self.peak_in_flight = 0
            self.completed = 0
            self.cancelled = 0
            self.usage: tuple[int, int] | None = (10, 5)  # None: about 4 characters a token
            self.rate_limit: RateLimit | None = None
            self.rejected_at: list[float] = []  # time.monotonic() of each 429 sent
            self._answer_headers: dict[int, dict[str, str]] = {}
            # Streaming: seconds between chunks; a stall (no chunk for stall_for seconds)
            # before chunk number stall_at; usage sent when the client asks for it.
            self.token_delay = 0.0
            self.stall_at: int | None = None
            self.stall_for = 0.0
            self.stream_usage = True
            self.chunks_sent = 0
            self._stream_starts: dict[int, tuple[dict, float]] = {}
            # Prompt caches: "auto" serves repeated message prefixes as OpenAI does.
            self.auto_cache = False
            self._cached_prefixes: set[str] = set()
            self.anthropic_requests: list[dict] = []  # the raw Messages API bodies
            # A model's window: prompts over this many tokens get OpenAI's 400.
            self.context_window: int | None = None
            self.context_errors = 0
            # Cut answers longer than the request's max_tokens (~4 characters a token)
            # and say "length", as providers do.
            self.enforce_max_tokens = False
            self._cut: set[int] = set()
            self._reset_local_server_modes()
            self._reset_wire_modes()
            self._reset_closing_modes()
            self._reset_slot_modes()

    def script(self, model: str, replies: list[Reply]) -> None:
        """Queue replies for a model, used in order before its default reply."""
        with self._lock:
            self.scripts[model].extend(replies)

    def reply_with(self, model: str, reply: Reply) -> None:
        """The reply for every request to ``model`` once its script is used up."""
        self.model_replies[model] = reply

    def fail(
        self,
        kind: str,
        times: int = 1,
        model: str | None = None,
        match: str | None = None,
        after: int = 0,
        headers: dict[str, str] | None = None,
    ) -> None:
        assert kind in (*_FAILURES, "hang")
        with self._lock:
            self.failures.append(Failure(kind, times, model, match, after, headers))

    def limit_rate(
        self,
        rps: float | None = None,
        burst: float | None = None,
        tps: float | None = None,
        token_burst: float | None = None,
        headers: str = "all",
        announce_rpm: float | None = None,
        announce_tpm: float | None = None,
    ) -> None:
        """Enforce requests and/or tokens (prompt tokens, ~4 characters each) per second,
        as token buckets; ``headers`` is "all", "retry-after" or "none".

        ``announce_rpm`` / ``announce_tpm`` make the limit quantized, as OpenAI's and
        Azure's may be: the headers announce this budget per minute while the small
        bucket is what is enforced (and what ``remaining`` counts)."""
        assert headers in ("all", "retry-after", "none")
        announced = {
            kind: value
            for kind, value in (("requests", announce_rpm), ("tokens", announce_tpm))
            if value
        }
        with self._lock:
            self.rate_limit = RateLimit(
                TokenBucket(rps, burst or rps) if rps else None,
                TokenBucket(tps, token_burst or tps) if tps else None,
                headers,
                announced or None,
            )

    def limit_rate_per_minute(
        self,
        rps: float | None = None,
        burst: float | None = None,
        tps: float | None = None,
        token_burst: float | None = None,
        token_factor: float = 1.0,
        headers: str = "all",
    ) -> None:
        """As ``limit_rate``, but the headers announce the minute's budget as OpenAI's do
        (see ``MinuteBudgetLimit``). ``token_factor``: prompts count that many times ~4
        characters a token, in the limit and in the usage reported (set ``usage = None``)."""
        with self._lock:
            self.rate_limit = minute_budget_limit(
                rps, burst, tps, token_burst, token_factor, headers
            )
            self.chars_per_token = 4.0 / token_factor

    @property
    def rejected(self) -> int:
        """Requests answered with 429, by the rate limit or an injected failure."""
        return len(self.rejected_at)

    def index_of(self, content: str) -> int:
        """Index (in ``requests`` and ``arrivals``) of the first request whose last
        message is ``content``."""
        return next(
            i for i, r in enumerate(self.requests) if r["messages"][-1]["content"] == content
        )

    def requests_for(self, model: str) -> list[dict]:
        return [r for r in self.requests if r.get("model") == model]

    def wait_for(self, predicate: Callable[[], bool], timeout: float = 60.0) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if predicate():
                return True
            time.sleep(0.01)
        return predicate()

    # -- serving ------------------------------------------------------------------------
    async def answer(self, body: dict) -> str:
        with self._lock:
            self.requests.append(body)
            self.arrivals.append(time.monotonic())
            if self.rate_limit is not None:
                admitted, headers = self.rate_limit.admit(prompt_tokens(body))
                self._answer_headers[id(body)] = headers
                if not admitted:
                    self.rejected_at.append(time.monotonic())
                    # Rejected at once, as providers do: it never counts as in flight.
                    raise HTTPError(
                        429, self.rate_limit.refusal, "rate_limit_error", headers=headers
                    )
            tokens = self.count_prompt(body)
            if self.context_window is not None and tokens > self.context_window:
                self.context_errors += 1
                raise HTTPError(
                    400,
                    f"This model's maximum context length is "
                    f"{self.context_window} tokens. However, your messages "
                    f"resulted in {tokens} tokens. Please reduce the length "
                    "of the messages.",
                    "invalid_request_error",
                )
            self._refuse_as_vllm_would(body, tokens)
            self.in_flight += 1
            self.peak_in_flight = max(self.peak_in_flight, self.in_flight)
            failure = self._take_failure(body)
        try:
            if failure is not None and failure.kind == "hang":
                await asyncio.sleep(3600)
            delay = (
                self.latency_for(body)
                if self.latency_for
                else self.model_latency.get(body.get("model"), self.latency)
            )
            if delay:
                await asyncio.sleep(delay)
            if failure is not None:
                if failure.kind == "429":
                    with self._lock:
                        self.rejected_at.append(time.monotonic())
                raise HTTPError(*_FAILURES[failure.kind], headers=failure.headers)
            text = self._reply_for(body)
            if self.generation_rate and not body.get("stream"):
                await self._generate_unstreamed(text)
            limit = body.get("max_tokens")
            if self.enforce_max_tokens and isinstance(limit, int) and len(text) > 4 * limit:
                text = text[: 4 * limit]
                with self._lock:
                    self._cut.add(id(body))
            if not body.get("stream"):  # a stream is complete when its last chunk went
                with self._lock:
                    self.completed += 1
            return text
        except asyncio.CancelledError:  # the client closed the connection
            with self._lock:
                self.cancelled += 1
            raise
        finally:
            with self._lock:
                self.in_flight -= 1

    def response_headers(self, body: dict) -> dict[str, str] | None:
        with self._lock:
            return self._answer_headers.pop(id(body), None)

    def usage_for(self, body: dict, text: str) -> tuple[int, int]:
        if self.usage:
            return self.usage
        return self.count_prompt(body), max(1, round(len(text) / self.chars_per_token))

    # -- streaming and prompt caches ----------------------------------------------------
    async def _stream_chat(self, request, body, text, usage):
        if self.sse_body is not None or self.ignores_stream:
            return await self._scripted_stream(request, body, text, usage)
        try:
            return await self._counted_stream(super()._stream_chat(request, body, text, usage))
        finally:
            self._stream_starts.pop(id(body), None)

    async def _counted_stream(self, streaming):
        """Counts a stream as completed when its last chunk went, as cancelled when the
        client closed the connection first."""
        try:
            response = await streaming
        except (asyncio.CancelledError, ConnectionError):
            with self._lock:
                self.cancelled += 1
            raise
        with self._lock:
            self.completed += 1
        return response

    def chunk_delay(self, body: dict, index: int) -> float:
        with self._lock:
            self.chunks_sent += 1
            self.tokens_generated += 1
        if self.stall_at is not None and index == self.stall_at:
            return self.stall_for
        if self.drop_at is not None and index == self.drop_at:
            raise ConnectionResetError("the server went away")  # the stream just ends
        delay = 1.0 / self.generation_rate if self.generation_rate else self.token_delay
        if not delay:
            return 0.0
        # On a schedule from the first chunk, not a sleep per chunk: sleeps overshoot, and
        # 300 of them would make a streamed answer slower than its generation time.
        now = time.monotonic()
        if index == 0:
            self._stream_starts[id(body)] = (body, now)
        started = self._stream_starts.get(id(body))
        if started is None or started[0] is not body:
            return delay
        return max(0.0, started[1] + (index + 1) * delay - now)

    # -- local servers: slow generation, their own windows and tokenizers -----------------
    def _reset_local_server_modes(self) -> None:
        # Generation at this many tokens (streamed pieces) a second, streamed or not;
        # every piece generated is counted, so a test sees any token generated twice.
        self.generation_rate: float | None = None
        self.tokens_generated = 0
        # Characters per token of this server's tokenizer (prompt counts, the window's
        # check, usage when ``usage`` is None).
        self.chars_per_token = 4.0
        # Report the window as a local server does: ("llama.cpp" | "vllm" | "ollama",
        # tokens); None: those endpoints answer 404, as a cloud provider's do.
        self.reports_window: tuple[str, int] | None = None
        self.window_asks: list[str] = []  # the paths asked for it
        # vLLM's check: prompt plus max_tokens over the window is refused.
        self.counts_max_tokens = False
        # A server that dies before streamed chunk number drop_at (no end, no [DONE]).
        self.drop_at: int | None = None
        self._reset_probe_modes()

    def _reset_probe_modes(self) -> None:
        # An Ollama that runs models at its default window: /api/show gives no num_ctx,
        # /api/ps lists no model until ``ollama_loaded`` (the window it then runs with).
        self.ollama_default = False
        self.ollama_loaded: int | None = None
        # Bytes of /props's answer when set (a window in a body too large to read).
        self.props_size: int | None = None

    def _probe_mode_answer(self, path: str):
        """The answer of the probe modes above to ``path``, or None."""
        from aiohttp import web

        if self.ollama_default and path == "/api/show":
            return web.json_response(
                {"parameters": "temperature 0.7", "model_info": {"gemma3.context_length": 32768}}
            )
        if self.ollama_default and path == "/api/ps":
            loaded = self.ollama_loaded
            return web.json_response(
                {
                    "models": []
                    if loaded is None
                    else [
                        {"name": name, "context_length": loaded}
                        for name in ("sub-model", "root-model")
                    ]
                }
            )
        if self.props_size and path == "/props":
            padding = "x" * self.props_size
            return web.json_response(
                {"default_generation_settings": {"n_ctx": 2048}, "padding": padding}
            )
        return None

    def count_prompt(self, body: dict) -> int:
        """A prompt's tokens by this server's tokenizer (``chars_per_token``)."""
        characters = sum(len(_text_of(m.get("content"))) for m in body.get("messages", []))
        return max(1, round(characters / self.chars_per_token))

    def _refuse_as_vllm_would(self, body: dict, tokens: int) -> None:
        limit = body.get("max_tokens")
        if (
            self.counts_max_tokens
            and self.context_window
            and isinstance(limit, int)
            and tokens + limit > self.context_window
        ):
            self.context_errors += 1
            raise HTTPError(
                400,
                f"This model's maximum context length is "
                f"{self.context_window} tokens. However, you requested "
                f"{tokens + limit} tokens ({tokens} in the messages, {limit} "
                "in the completion). Please reduce the length of the messages "
                "or completion.",
                "BadRequestError",
            )

    async def _generate_unstreamed(self, text: str) -> None:
        """An unstreamed answer takes as long to generate as a streamed one."""
        pieces, started = len(split_tokens(text)), time.monotonic()
        try:
            await asyncio.sleep(pieces / self.generation_rate)
        finally:  # a request cancelled midway generated what its time allowed
            made = min(pieces, round((time.monotonic() - started) * self.generation_rate))
            with self._lock:
                self.tokens_generated += made

    def _window_routes(self, router) -> None:
        router.add_get("/props", self._window_answer)
        router.add_get("/slots", self._window_answer)
        router.add_get("/v1/models", self._window_answer)
        router.add_get("/api/ps", self._window_answer)
        router.add_post("/api/show", self._window_answer)

    async def _window_answer(self, request):
        from aiohttp import web

        path = request.path
        with self._lock:
            self.window_asks.append(path)
            reported = self.reports_window
        kind, size = reported or (None, 0)
        special = self._probe_mode_answer(path)
        if special is not None:
            return special
        if kind == "llama.cpp" and path == "/props":
            return web.json_response(
                {"default_generation_settings": {"n_ctx": size}, "total_slots": 8}
            )
        if kind == "llama.cpp" and path == "/slots":
            return web.json_response([{"id": i, "n_ctx": size} for i in range(8)])
        if kind == "vllm" and path == "/v1/models":
            return web.json_response(
                {
                    "object": "list",
                    "data": [
                        {"id": "sub-model", "object": "model", "max_model_len": size},
                        {"id": "root-model", "object": "model", "max_model_len": size},
                    ],
                }
            )
        if kind == "ollama" and path == "/api/show":
            return web.json_response(
                {
                    "parameters": f"num_ctx                        {size}",
                    "model_info": {"gemma3.context_length": 32768},
                }
            )
        if kind == "ollama" and path == "/api/ps":
            return web.json_response({"models": []})
        return web.json_response({"error": "not found"}, status=404)

    def finish_reason(self, body: dict) -> str:
        if self.finish_word is not None:
            return self.finish_word
        with self._lock:
            if id(body) in self._cut:
                self._cut.discard(id(body))
                return "length"
            return "stop"

    # -- servers that break OpenAI's stream format, and redirects --------------------------
    def _reset_wire_modes(self) -> None:
        # A streamed request answered with these bytes as they are (a function of the
        # request's reply text, or bytes), then the end of the body.
        self.sse_body: bytes | Callable[[str], bytes] | None = None
        # A server that ignores ``stream: true``: a streamed request gets a JSON body.
        self.ignores_stream = False
        # The finish reason stated instead of "stop" (e.g. "max_tokens", "eos_token").
        self.finish_word: str | None = None
        # Chat requests answered with a 307 to this URL; what arrives there is recorded.
        self.redirect_to: str | None = None
        self.redirected: list[dict] = []  # headers of requests that followed a redirect

    async def _scripted_stream(self, request, body, text, usage):
        from aiohttp import web

        if self.ignores_stream:
            with self._lock:
                self.completed += 1
            return web.json_response(completion_json(body, text, usage, self))
        sse = self.sse_body(text) if callable(self.sse_body) else self.sse_body
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(sse)
        await response.write_eof()
        return response

    async def _chat(self, request):
        from aiohttp import web

        if self.redirect_to is not None:
            return web.Response(status=307, headers={"Location": self.redirect_to})
        return await super()._chat(request)

    async def _redirected(self, request):
        from aiohttp import web

        with self._lock:
            self.redirected.append(dict(request.headers))
        return web.json_response(completion_json(await request.json(), "redirected", (1, 1), self))

    def cached_tokens(self, body: dict) -> int:
        """OpenAI's automatic cache: the longest run of leading messages seen before."""
        if not self.auto_cache:
            return 0
        cached, size, digest = 0, 0, hashlib.sha1()
        for message in body.get("messages", []):
            digest.update(json.dumps(message, sort_keys=True).encode())
            size += len(_text_of(message.get("content"))) // 4
            key = digest.hexdigest()
            with self._lock:
                if key in self._cached_prefixes:
                    cached = size
                self._cached_prefixes.add(key)
        return cached

    def _add_routes(self, router) -> None:
        self._slot_routes(router)  # first: in slots mode, these answer before the others
        super()._add_routes(router)
        self._window_routes(router)
        router.add_post("/v1/messages", self._messages)
        router.add_post("/elsewhere/chat/completions", self._redirected)

    @property
    def anthropic_base(self) -> str:
        """api_base for litellm's ``anthropic/`` models (it appends ``/v1/messages``)."""
        return f"http://{self.host}:{self.port}"

    async def _messages(self, request):
        """Anthropic's Messages API: the reply of ``answer`` (for the same model and
        the messages flattened to text), with Anthropic's usage and cache fields."""
        from aiohttp import web

        body = await request.json()
        with self._lock:
            self.anthropic_requests.append(body)
        system = body.get("system")
        messages = ([{"role": "system", "content": _text_of(system)}] if system else []) + [
            {"role": m["role"], "content": _text_of(m.get("content"))}
            for m in body.get("messages", [])
        ]
        flat = {
            "model": body.get("model"),
            "messages": messages,
            "stream": bool(body.get("stream")),
        }
        try:
            text = await self.answer(flat)
        except HTTPError as error:
            return web.json_response(
                {"type": "error", "error": {"type": error.kind, "message": error.message}},
                status=error.status,
                headers=error.headers,
            )
        prompt, output = self.usage_for(flat, text)
        read, written = self._anthropic_cache(body)
        # Anthropic's input_tokens excludes the cached and cache-written parts.
        usage = {
            "input_tokens": max(0, prompt - read - written),
            "output_tokens": output,
            "cache_read_input_tokens": read,
            "cache_creation_input_tokens": written,
        }
        message = {
            "id": "msg_test",
            "type": "message",
            "role": "assistant",
            "model": body.get("model"),
            "stop_reason": "end_turn",
            "stop_sequence": None,
        }
        if not body.get("stream"):
            with self._lock:
                self.completed += 1
            return web.json_response(
                {**message, "content": [{"type": "text", "text": text}], "usage": usage}
            )
        return await self._counted_stream(
            self._stream_messages(request, flat, message, usage, text, output)
        )

    async def _stream_messages(self, request, flat, message, usage, text, output):
        from aiohttp import web

        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)

        async def send(event: str, data: dict) -> None:
            await response.write(f"event: {event}\ndata: {json.dumps(data)}\n\n".encode())

        await send(
            "message_start",
            {
                "type": "message_start",
                "message": {
                    **message,
                    "content": [],
                    "stop_reason": None,
                    "usage": {**usage, "output_tokens": 1},
                },
            },
        )
        await send(
            "content_block_start",
            {
                "type": "content_block_start",
                "index": 0,
                "content_block": {"type": "text", "text": ""},
            },
        )
        for index, piece in enumerate(split_tokens(text)):
            delay = self.chunk_delay(flat, index)
            if delay:
                await asyncio.sleep(delay)
            await send(
                "content_block_delta",
                {
                    "type": "content_block_delta",
                    "index": 0,
                    "delta": {"type": "text_delta", "text": piece},
                },
            )
        await send("content_block_stop", {"type": "content_block_stop", "index": 0})
        await send(
            "message_delta",
            {
                "type": "message_delta",
                "delta": {"stop_reason": "end_turn", "stop_sequence": None},
                "usage": {"output_tokens": output},
            },
        )
        await send("message_stop", {"type": "message_stop"})
        await response.write_eof()
        return response

    def _anthropic_cache(self, body: dict) -> tuple[int, int]:
        """(tokens read from the cache, tokens written to it), as Anthropic counts them:
        a prefix is cached when an earlier request put a ``cache_control`` breakpoint at
        its end; this request reads the longest such prefix and writes its own
        breakpoints past it."""
        blocks = _blocks(body.get("system")) + [
            block for m in body.get("messages", []) for block in _blocks(m.get("content"))
        ]
        digest, size, read, written_to = hashlib.sha1(), 0, 0, 0
        marks = []
        for block in blocks:
            digest.update(
                json.dumps(
                    {k: v for k, v in block.items() if k != "cache_control"}, sort_keys=True
                ).encode()
            )
            size += len(block.get("text", "")) // 4
            key = digest.hexdigest()
            with self._lock:
                if key in self._cached_prefixes:
                    read = size
            if block.get("cache_control"):
                marks.append((key, size))
        for key, end in marks:
            if end > read:
                with self._lock:
                    self._cached_prefixes.add(key)
                written_to = end
        return read, max(0, written_to - read)

    @property
    def cache_markers(self) -> list[int]:
        """How many ``cache_control`` breakpoints each Messages API request carried."""
        return [
            sum(1 for block in _blocks(b.get("system")) if block.get("cache_control"))
            + sum(
                1
                for m in b.get("messages", [])
                for block in _blocks(m.get("content"))
                if block.get("cache_control")
            )
            for b in self.anthropic_requests
        ]

    def _take_failure(self, body: dict) -> Failure | None:
        for failure in self.failures:
            if failure.times > 0 and failure.applies(body):
                failure.times -= 1
                return failure
        return None

    def _reply_for(self, body: dict) -> str:
        model = body.get("model", "")
        with self._lock:
            queue = self.scripts.get(model)
            reply = queue.popleft() if queue else None
        if reply is None:
            reply = self.model_replies.get(model, self.default_reply)
        return reply(body) if callable(reply) else reply

    # -- a local server's slots: N requests served at once, the rest queued ---------------
    def _reset_slot_modes(self) -> None:
        # Serve this many chat requests at once and queue the rest, as llama.cpp's
        # --parallel does: a queued request gets no byte until a slot frees. The server
        # then plays llama.cpp: /props reports total_slots (``reported_slots``, else
        # ``slots``; the window too when ``reports_window`` gives one), /slots each slot's
        # is_processing. (With ``reports_window`` of "vllm" it plays vLLM instead: no
        # /props, and /metrics counts the requests running and waiting.)
        self.slots: int | None = None
        self.reported_slots: int | None = None
        self.queued = 0  # requests waiting for a slot now
        self.peak_queued = 0
        self.busy_asks = 0  # /slots and /metrics asked whether the server is working
        # POST /tokenize counts tokens at ``chars_per_token``, as llama.cpp's and vLLM's
        # do (with ``reports_window``'s kind, else llama.cpp's form).
        self.tokenizes = False
        self.tokenize_asks: list[int] = []  # characters of each text tokenized
        self._processing = 0
        self._slot_gate: tuple[int, asyncio.Semaphore] | None = None

    def _slot_routes(self, router) -> None:
        router.add_post("/v1/chat/completions", self._chat_in_slot)
        router.add_post("/chat/completions", self._chat_in_slot)
        router.add_get("/props", self._slot_props)
        router.add_get("/slots", self._slot_list)
        router.add_get("/metrics", self._slot_metrics)
        router.add_post("/tokenize", self._tokenize)

    def _plays_vllm(self) -> bool:
        return self.reports_window is not None and self.reports_window[0] == "vllm"

    async def _chat_in_slot(self, request):
        slots = self.slots
        if slots is None:
            return await self._chat(request)
        if self._slot_gate is None or self._slot_gate[0] != slots:
            self._slot_gate = (slots, asyncio.Semaphore(slots))  # on the server's loop
        gate = self._slot_gate[1]
        queued = gate.locked()
        if queued:
            with self._lock:
                self.queued += 1
                self.peak_queued = max(self.peak_queued, self.queued)
        try:
            await gate.acquire()
        finally:
            if queued:
                with self._lock:
                    self.queued -= 1
        try:
            with self._lock:
                self._processing += 1
            return await self._chat(request)
        finally:
            with self._lock:
                self._processing -= 1
            gate.release()

    async def _slot_props(self, request):
        from aiohttp import web

        if self.slots is None or self._plays_vllm():
            return await self._window_answer(request)
        with self._lock:
            self.window_asks.append(request.path)
        props: dict = {"total_slots": self.reported_slots or self.slots}
        if self.reports_window is not None:
            props["default_generation_settings"] = {"n_ctx": self.reports_window[1]}
        return web.json_response(props)

    async def _slot_list(self, request):
        from aiohttp import web

        if self.slots is None or self._plays_vllm():
            return await self._window_answer(request)
        with self._lock:
            self.window_asks.append(request.path)
            self.busy_asks += 1
            processing = self._processing
        size = self.reports_window[1] if self.reports_window is not None else None
        return web.json_response(
            [
                {"id": i, "is_processing": i < processing, **({"n_ctx": size} if size else {})}
                for i in range(self.reported_slots or self.slots)
            ]
        )

    async def _slot_metrics(self, request):
        from aiohttp import web

        if self.slots is None or not self._plays_vllm():
            return web.json_response({"error": "not found"}, status=404)
        with self._lock:
            self.busy_asks += 1
            running, waiting = self._processing, self.queued
        return web.Response(
            text="# HELP vllm:num_requests_running Number of requests running.\n"
            f'vllm:num_requests_running{{model_name="sub-model"}} {float(running)}\n'
            f'vllm:num_requests_waiting{{model_name="sub-model"}} {float(waiting)}\n'
        )

    async def _tokenize(self, request):
        from aiohttp import web

        if not self.tokenizes:
            return web.json_response({"error": "not found"}, status=404)
        body = await request.json()
        text = body.get("prompt" if self._plays_vllm() else "content") or ""
        with self._lock:
            self.tokenize_asks.append(len(text))
        tokens = list(range(max(1, round(len(text) / self.chars_per_token))))
        if self._plays_vllm():
            return web.json_response({"count": len(tokens), "tokens": tokens})
        return web.json_response({"tokens": tokens})


def _blocks(content) -> list[dict]:
    if not content:
        return []
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    return [block for block in content if isinstance(block, dict)]


def _text_of(content) -> str:
    return "".join(block.get("text", "") for block in _blocks(content))


def main() -> None:
    """Serve on its own (benchmarks run it in a separate process): prints its URL, then
    answers each line "stats" on stdin with a JSON line of its counters."""
    import argparse
    import json
    import sys

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--latency", type=float, default=0.0)
    parser.add_argument("--rps", type=float, help="requests/s allowed (429 beyond)")
    parser.add_argument("--burst", type=float, help="requests allowed at once")
    parser.add_argument("--tps", type=float, help="prompt tokens/s allowed")
    parser.add_argument("--token-burst", type=float)
    parser.add_argument("--headers", default="all", choices=["all", "retry-after", "none"])
    parser.add_argument(
        "--token-delay", type=float, default=0.0, help="seconds between streamed chunks"
    )
    parser.add_argument(
        "--announce-rpm", type=float, help="quantized: the requests/minute the headers announce"
    )
    parser.add_argument(
        "--announce-tpm", type=float, help="quantized: the tokens/minute the headers announce"
    )
    parser.add_argument(
        "--minute-headers",
        action="store_true",
        help="the headers announce the minute's budget, as OpenAI's do",
    )
    parser.add_argument(
        "--token-factor",
        type=float,
        default=1.0,
        help="with --minute-headers: count prompt tokens as this many times ~4 characters "
        "a token (another tokenizer), in the limit and in usage",
    )
    parser.add_argument(
        "--tokens-per-second",
        type=float,
        help="generate answers at this rate: streamed, chunk by chunk; "
        "unstreamed, whole when the last token is made",
    )
    parser.add_argument(
        "--model-latency",
        action="append",
        default=[],
        metavar="MODEL=SECONDS",
        help="a model's own latency",
    )
    parser.add_argument(
        "--rlm-root",
        metavar="MODEL",
        help="MODEL plays a 2-turn RLM root: it chunks the context into "
        "64 parts, asks the sub-model about each in one batch, then "
        "finishes with FINAL_VAR(answers)",
    )
    parser.add_argument(
        "--close-every", type=int, help="close each connection after every Nth answer on it"
    )
    parser.add_argument("--keep-alive", type=float, help="close connections idle this many seconds")
    args = parser.parse_args()
    server = FakeLLMServer(port=args.port).start()
    server.close_every = args.close_every
    if args.keep_alive is not None:
        server.close_idle_after(args.keep_alive)
    server.latency = args.latency
    server.token_delay = args.token_delay
    for pair in args.model_latency:
        name, seconds = pair.split("=")
        server.model_latency[name] = float(seconds)
    if args.tokens_per_second:
        rate = args.tokens_per_second
        server.token_delay = 1 / rate
        server.latency_for = lambda body: (
            0.0 if body.get("stream") else len(split_tokens(echo(body))) / rate
        )
    if args.rlm_root:
        server.reply_with(args.rlm_root, _rlm_root_turn)
    server.usage = None  # count prompt tokens as a token limit does
    server.requests = _Discard()  # a long benchmark must not grow memory
    if args.rps or args.tps:
        server.limit_rate(
            args.rps,
            args.burst,
            args.tps,
            args.token_burst,
            args.headers,
            args.announce_rpm,
            args.announce_tpm,
        )
    if (args.rps or args.tps) and args.minute_headers:
        server.limit_rate_per_minute(
            args.rps, args.burst, args.tps, args.token_burst, args.token_factor, args.headers
        )
    print(server.base_url, flush=True)
    for line in sys.stdin:
        if line.strip() == "stats":
            print(
                json.dumps(
                    {
                        "completed": server.completed,
                        "rejected": server.rejected,
                        "peak_in_flight": server.peak_in_flight,
                        "connections": server.connections,
                        "rejected_at": server.rejected_at[-1000:],  # time.monotonic()
                    }
                ),
                flush=True,
            )
    threading.Event().wait()


def _rlm_root_turn(body: dict) -> str:
    """A scripted root model's turn: chunk and fan out, then finish."""
    if any(m["role"] == "assistant" for m in body["messages"]):
        return "The parts are summarised.\nFINAL_VAR(answers)"
    return (
        "I split the context into 64 parts and ask about each.\n```repl\n"
        "size = len(context) // 64 + 1\n"
        "parts = [context[i:i + size] for i in range(0, len(context), size)]\n"
        "answers = llm_query_batch([f'Summarise: {p[:200]}' for p in parts])\n"
        "print(len(answers))\n```"
    )


class _Discard(list):
    def append(self, item) -> None:
        pass


if __name__ == "__main__":
    main()
