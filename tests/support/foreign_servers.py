"""Servers that are not ours: OpenAI-compatible chat endpoints that count, limit and
keep connections their own way, for the matrix of server behaviours (issue 38).

``tests/llm_server.py`` is the project's own test server: it counts tokens as our
estimate does (4 characters a token, times a factor) and was tuned beside the code it
tests. A ``ForeignServer`` shares none of that. It counts a prompt's tokens by its own
rule, a word-piece tokenizer's: one token per run of letters, digits or punctuation,
one per CJK character, and a chat template's few per message. So what it counts
against our estimate depends on the text, as with a real provider: short words
("a a a") count 2x, three-letter words 1x, seven-letter words 0.5x, CJK text 4x
(``text_counting``). It reports that true count in its usage, plain and streamed, and
limits on it.

Its behaviour is a ``Behaviour``: how it announces limits (OpenAI's per-minute
``x-ratelimit-*`` with resets like ``6m0s``, Anthropic's ``anthropic-ratelimit-*`` with
RFC 3339 times, or nothing), how it says when to come back (``retry-after`` in whole
seconds or as an HTTP date, or not at all), the body of its 429 (OpenAI's, Anthropic's,
plain text, empty), and what it does with connections: keeps them alive, closes each
right after its answer (streamed or not) though it announced keep-alive, closes them
after so many idle milliseconds, or queues requests behind a few slots as llama.cpp
does. Limits are enforced as a provider does: a bucket of one second's tokens (and
requests), refilled continuously, while the headers speak of the minute.

It runs on its own event loop in a thread (``start``) on 127.0.0.1, or in a process of
its own: ``python -m tests.support.foreign_servers '<behaviour as JSON>'`` prints its base URL,
then answers ``stats`` on stdin with a JSON line (the benchmarks use that).
"""

from __future__ import annotations

import asyncio
import functools
import json
import math
import re
import sys
import threading
import time
import weakref
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from email.utils import formatdate
from typing import Any

# One token per CJK character, per run of word characters, per other mark.
_TOKEN = re.compile(r"[\u3040-\u30ff\u3400-\u9fff]|[^\W\u3040-\u30ff\u3400-\u9fff]+|[^\w\s]")
TEMPLATE_TOKENS_PER_MESSAGE = 4
TEMPLATE_TOKENS = 3


def tokens_of(text: str) -> int:
    """Tokens of ``text`` as this server's tokenizer counts them."""
    return len(_TOKEN.findall(text))


def prompt_tokens(body: dict[str, Any]) -> int:
    """A request's prompt as this server counts it: its text, and the chat template."""
    messages = body.get("messages") or []
    text = sum(tokens_of(m.get("content") or "") for m in messages if isinstance(m, dict))
    return text + TEMPLATE_TOKENS + TEMPLATE_TOKENS_PER_MESSAGE * len(messages)


# Text the server counts at k times our estimate (4 characters a token), by its rule.
_WORDS_AT = {0.5: "seventy", 1.0: "one", 2.0: "a"}


def text_counting(k: float, tokens: int, tag: str = "") -> str:
    """A prompt this server counts as ``tokens`` tokens, ``k`` times what our estimate
    (4 characters a token) makes of it: dense words for 0.5x-2x, CJK text for 4x.
    ``tag`` (a word or number) starts it, to tell prompts apart."""
    head = f"{tag} " if tag else ""
    left = max(1, tokens - tokens_of(head) - TEMPLATE_TOKENS - TEMPLATE_TOKENS_PER_MESSAGE)
    if k == 4.0:
        return head + "漢" * left
    word = _WORDS_AT[k]
    return head + " ".join([word] * left)


@dataclass
class Behaviour:
    """How one foreign server counts, limits and keeps connections."""

    # Limits enforced: tokens (as this server counts them) and requests per second,
    # each a bucket holding ``burst_s`` seconds of its rate. None: no such limit.
    tokens_per_s: float | None = None
    requests_per_s: float | None = None
    burst_s: float = 1.0
    # "openai": x-ratelimit-* announcing the minute's budget (reset "6m0s", "1.5s");
    # "anthropic": anthropic-ratelimit-* with RFC 3339 resets; "none".
    header_style: str = "openai"
    retry_after: str = "seconds"  # "seconds" (whole, rounded up), "date", "none"
    refusal_body: str = "openai"  # "openai", "anthropic", "plain", "empty"
    # "keep-alive"; "close-after-answer" (announced keep-alive all the same);
    # "close-idle" (after ``idle_close_ms``).
    connection: str = "keep-alive"
    idle_close_ms: float = 50.0
    # "close-after-answer": the close follows the answer this much later; a request
    # that comes on the connection meanwhile is not read (as a server that has decided
    # to close: cpp-httplib's), and meets the close.
    close_delay_ms: float = 0.0
    slots: int | None = None  # requests generated at once; the rest queue, as llama.cpp's
    latency_s: float = 0.05  # a whole answer's generation time (a slot's)
    chunks: int = 4  # streamed pieces of an answer

    def to_json(self) -> str:
        return json.dumps(asdict(self))


@dataclass
class Stats:
    requests: int = 0  # chat requests read whole
    answered: int = 0
    rejected: int = 0  # 429s
    connections: int = 0  # connections that carried a chat request
    closed_after_answer: int = 0
    unread: int = 0  # requests that came on a connection closing after its answer
    peak_generating: int = 0
    counted: list[int] = field(default_factory=list)  # prompt tokens of each answered
    # (time.monotonic(), status, tokens counted) of each request, as it arrived
    arrivals: list[tuple[float, int, int]] = field(default_factory=list)


class _Bucket:
    def __init__(self, rate: float, capacity: float):
        self.rate, self.capacity = rate, capacity
        self.level, self.stamp = capacity, time.monotonic()

    def refill(self, now: float) -> None:
        self.level = min(self.capacity, self.level + (now - self.stamp) * self.rate)
        self.stamp = now

    def wait_for(self, amount: float) -> float:
        return max(0.0, amount - self.level) / self.rate


def go_duration(seconds: float) -> str:
    """OpenAI's spelling of a reset: '6m0s', '1.5s', '120ms'."""
    if seconds < 1:
        return f"{max(1, math.ceil(seconds * 1000))}ms"
    minutes, rest = divmod(seconds, 60)
    rest_s = f"{rest:.3f}".rstrip("0").rstrip(".")
    return f"{int(minutes)}m{rest_s}s" if minutes else f"{rest_s}s"


class ForeignServer:
    """An OpenAI-compatible chat endpoint with a ``Behaviour`` (see the module)."""

    def __init__(self, behaviour: Behaviour | None = None):
        self.behaviour = behaviour or Behaviour()
        self.stats = Stats()
        self.base_url = ""
        self._loop: asyncio.AbstractEventLoop | None = None
        self._runner: Any = None
        self._seen: weakref.WeakSet[Any] = weakref.WeakSet()
        self._closing: weakref.WeakSet[Any] = weakref.WeakSet()
        self._idle_closes: weakref.WeakKeyDictionary[Any, asyncio.TimerHandle] = (
            weakref.WeakKeyDictionary()
        )
        self._generating = 0
        self._slots: asyncio.Semaphore | None = None
        self._limits_from(self.behaviour)

    def _limits_from(self, b: Behaviour) -> None:
        # Enforced: a second's worth (``burst_s``); announced: the minute's budget.
        self._enforced = {
            kind: _Bucket(rate, rate * b.burst_s)
            for kind, rate in (("tokens", b.tokens_per_s), ("requests", b.requests_per_s))
            if rate
        }
        self._minute = {
            kind: _Bucket(rate, rate * 60)
            for kind, rate in (("tokens", b.tokens_per_s), ("requests", b.requests_per_s))
            if rate
        }

    # -- running ------------------------------------------------------------------------
    def start(self) -> ForeignServer:
        started = threading.Event()
        threading.Thread(target=self._run, args=(started,), daemon=True).start()
        started.wait(10)
        return self

    def _run(self, started: threading.Event) -> None:
        loop = self._loop = asyncio.new_event_loop()
        loop.run_until_complete(self._serve())
        started.set()
        loop.run_forever()

    async def _serve(self) -> None:
        from aiohttp import web

        app = web.Application()
        app.router.add_post("/v1/chat/completions", self._chat)
        self._runner = web.AppRunner(app, keepalive_timeout=75.0, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = self._runner.addresses[0][1]
        self.base_url = f"http://127.0.0.1:{port}/v1"
        if self.behaviour.slots:
            self._slots = asyncio.Semaphore(self.behaviour.slots)

    def stop(self) -> None:
        loop = self._loop
        if loop is None:
            return
        asyncio.run_coroutine_threadsafe(self._runner.cleanup(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)

    # -- answering ----------------------------------------------------------------------
    async def _chat(self, request: Any) -> Any:
        from aiohttp import web

        transport = request.transport
        idle_close = self._idle_closes.pop(transport, None) if transport else None
        if idle_close is not None:
            idle_close.cancel()  # came in time
        if transport is not None and transport in self._closing:
            self.stats.unread += 1  # this server reads nothing more on it: closed
            transport.close()
            return web.Response(status=500)  # (never sent: the transport is closed)
        if transport is not None and transport not in self._seen:
            self._seen.add(transport)
            self.stats.connections += 1
        body = await request.json()
        self.stats.requests += 1
        counted = prompt_tokens(body)
        refusal = self._admit(counted)
        self.stats.arrivals.append((time.monotonic(), 200 if refusal is None else 429, counted))
        if refusal is not None:
            self.stats.rejected += 1
            return refusal
        headers = {**self._limit_headers(), "Connection": "keep-alive"}
        if self.behaviour.connection == "close-after-answer" and transport is not None:
            self._closing.add(transport)  # decided now: nothing more is read on it
        if self._slots is not None:
            await self._slots.acquire()
        try:
            self._generating += 1
            self.stats.peak_generating = max(self.stats.peak_generating, self._generating)
            text = "ok: " + str((body.get("messages") or [{}])[-1].get("content", ""))[:24]
            usage = {
                "prompt_tokens": counted,
                "completion_tokens": tokens_of(text),
                "total_tokens": counted + tokens_of(text),
            }
            # (Counted before the answer's end goes out: a client that has it sees it.)
            answered = functools.partial(self._answered, counted, transport)
            if body.get("stream"):
                response = await self._streamed(request, text, usage, headers, answered)
            else:
                await asyncio.sleep(self.behaviour.latency_s)
                answered()
                response = web.json_response(_completion(text, usage), headers=headers)
                await response.prepare(request)
                await response.write_eof()
        finally:
            self._generating -= 1
            if self._slots is not None:
                self._slots.release()
        if self.behaviour.connection == "close-after-answer" and transport is not None:
            # The answer went out whole; keep-alive was announced all the same.
            delay = self.behaviour.close_delay_ms / 1000
            if delay:
                asyncio.get_running_loop().call_later(delay, transport.close)
            else:
                transport.close()
        elif self.behaviour.connection == "close-idle" and transport is not None:
            # Idle from the answer on (not from the connection's start: a client busy
            # opening it is not idle); the close crosses a request sent as it fires.
            self._idle_closes[transport] = asyncio.get_running_loop().call_later(
                self.behaviour.idle_close_ms / 1000, transport.close
            )
        return response

    def _answered(self, counted: int, transport: Any) -> None:
        self.stats.answered += 1
        self.stats.counted.append(counted)
        if self.behaviour.connection == "close-after-answer" and transport is not None:
            self.stats.closed_after_answer += 1

    async def _streamed(
        self,
        request: Any,
        text: str,
        usage: dict[str, int],
        headers: dict[str, str],
        answered: Callable[[], None],
    ) -> Any:
        from aiohttp import web

        response = web.StreamResponse(
            headers={**headers, "Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
        )
        await response.prepare(request)
        chunks = max(1, self.behaviour.chunks)
        step = math.ceil(len(text) / chunks)
        for i in range(chunks):
            await asyncio.sleep(self.behaviour.latency_s / chunks)
            piece = text[i * step : (i + 1) * step]
            await response.write(_event({"choices": [{"index": 0, "delta": {"content": piece}}]}))
        answered()
        await response.write(
            _event({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})
        )
        await response.write(_event({"choices": [], "usage": usage}))  # as llama.cpp: always
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response

    def _admit(self, counted: int) -> Any:
        """None when admitted (the buckets charged), else the 429 to send."""
        now = time.monotonic()
        needs = {"tokens": counted, "requests": 1}
        for bucket in (*self._enforced.values(), *self._minute.values()):
            bucket.refill(now)
        short = [k for k, b in self._enforced.items() if b.level < needs[k]]
        if not short:
            for kind, bucket in (*self._enforced.items(), *self._minute.items()):
                bucket.level -= needs[kind]
            return None
        wait = max(self._enforced[k].wait_for(needs[k]) for k in short)
        return self._refusal(short[0], counted, wait)

    def _refusal(self, kind: str, counted: int, wait: float) -> Any:
        from aiohttp import web

        b = self.behaviour
        headers = self._limit_headers()
        if b.retry_after == "seconds":
            headers["retry-after"] = str(max(1, math.ceil(wait)))
        elif b.retry_after == "date":
            headers["retry-after"] = formatdate(math.ceil(time.time() + wait), usegmt=True)
        minute = self._minute[kind]
        limit, used = int(minute.capacity), int(minute.capacity - minute.level)
        requested = counted if kind == "tokens" else 1
        per = "tokens per min (TPM)" if kind == "tokens" else "requests per min (RPM)"
        if b.refusal_body == "openai":
            sentence = (
                f"Rate limit reached for model in organization org-x on {per}: Limit "
                f"{limit}, Used {used}, Requested {requested}. Please try again in "
                f"{go_duration(wait)}."
            )
            payload: Any = {
                "error": {"message": sentence, "type": kind, "code": "rate_limit_exceeded"}
            }
        elif b.refusal_body == "anthropic":
            sentence = (
                f"This request would exceed the rate limit for your organization of {limit} "
                f"input {kind} per minute."
            )
            payload = {"type": "error", "error": {"type": "rate_limit_error", "message": sentence}}
        elif b.refusal_body == "plain":
            return web.Response(status=429, text="Too Many Requests", headers=headers)
        else:
            return web.Response(status=429, headers=headers)
        return web.json_response(payload, status=429, headers=headers)

    def _limit_headers(self) -> dict[str, str]:
        """The minute's budget, in the style of this server."""
        style, headers = self.behaviour.header_style, {}
        for kind, minute in self._minute.items():
            limit, remaining = int(minute.capacity), max(0, int(minute.level))
            to_full = (minute.capacity - minute.level) / minute.rate
            if style == "openai":
                headers[f"x-ratelimit-limit-{kind}"] = str(limit)
                headers[f"x-ratelimit-remaining-{kind}"] = str(remaining)
                headers[f"x-ratelimit-reset-{kind}"] = go_duration(to_full)
            elif style == "anthropic":
                name = "input-tokens" if kind == "tokens" else "requests"
                at = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() + to_full + 0.5))
                headers[f"anthropic-ratelimit-{name}-limit"] = str(limit)
                headers[f"anthropic-ratelimit-{name}-remaining"] = str(remaining)
                headers[f"anthropic-ratelimit-{name}-reset"] = at
        return headers


def _completion(text: str, usage: dict[str, int]) -> dict[str, Any]:
    return {
        "id": "chatcmpl-foreign",
        "object": "chat.completion",
        "model": "foreign",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": text},
                "finish_reason": "stop",
            }
        ],
        "usage": usage,
    }


def _event(data: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(data).encode() + b"\n\n"


def main() -> None:
    """Serve one behaviour (JSON, first argument) in this process: print the base URL,
    then a JSON line of stats for each ``stats`` line read."""
    behaviour = Behaviour(**json.loads(sys.argv[1])) if len(sys.argv) > 1 else Behaviour()
    server = ForeignServer(behaviour).start()
    print(server.base_url, flush=True)
    for line in sys.stdin:
        if line.strip().startswith("stats"):
            stats = asdict(server.stats)
            stats.pop("counted")
            if line.strip() != "stats log":
                stats.pop("arrivals")
            print(json.dumps(stats), flush=True)
        elif line.strip() == "reset":
            server.stats = Stats()
            server._limits_from(server.behaviour)
            print("{}", flush=True)


if __name__ == "__main__":
    main()
