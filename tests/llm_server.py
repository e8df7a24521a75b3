"""A local OpenAI-compatible chat server for tests and benchmarks.

It runs in a thread with its own event loop on 127.0.0.1, so tests on any loop (or a
kernel in another process) can reach it over real HTTP. It can script replies per
model, add latency, inject failures (500, 429, hang) and records every request and
the peak number in flight.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections import defaultdict, deque
from dataclasses import dataclass
from typing import Callable, Union

from aiohttp import web

Reply = Union[str, Callable[[dict], str]]


def echo(request: dict) -> str:
    """Default reply: 'echo: ' + the last user message."""
    return "echo: " + request["messages"][-1]["content"]


@dataclass
class Failure:
    kind: str  # "500", "429", "401", "hang"
    times: int
    model: str | None = None
    match: str | None = None  # fail only requests whose last message contains this

    def applies(self, body: dict) -> bool:
        if self.model is not None and body.get("model") != self.model:
            return False
        if self.match is not None and self.match not in body["messages"][-1]["content"]:
            return False
        return True


class FakeLLMServer:
    def __init__(self, host: str = "127.0.0.1", port: int = 0):
        self.host, self.port = host, port
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._runner: web.AppRunner | None = None
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
            self.in_flight = 0
            self.peak_in_flight = 0
            self.completed = 0
            self.cancelled = 0
            self.usage = (10, 5)  # prompt, completion tokens per reply

    def script(self, model: str, replies: list[Reply]) -> None:
        """Queue replies for a model, used in order before its default reply."""
        with self._lock:
            self.scripts[model].extend(replies)

    def reply_with(self, model: str, reply: Reply) -> None:
        """The reply for every request to ``model`` once its script is used up."""
        self.model_replies[model] = reply

    def fail(self, kind: str, times: int = 1, model: str | None = None,
             match: str | None = None) -> None:
        assert kind in ("500", "429", "401", "hang")
        with self._lock:
            self.failures.append(Failure(kind, times, model, match))

    def requests_for(self, model: str) -> list[dict]:
        return [r for r in self.requests if r.get("model") == model]

    def wait_for(self, predicate: Callable[[], bool], timeout: float = 5.0) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if predicate():
                return True
            time.sleep(0.01)
        return predicate()

    # -- lifecycle ----------------------------------------------------------------------
    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}/v1"

    def start(self) -> "FakeLLMServer":
        ready = threading.Event()
        self._thread = threading.Thread(target=self._serve, args=(ready,), daemon=True,
                                        name="fake-llm-server")
        self._thread.start()
        if not ready.wait(10):
            raise RuntimeError("fake LLM server did not start")
        return self

    def stop(self) -> None:
        if self._loop is not None:
            asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(5)
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(5)
            self._loop = None

    def _serve(self, ready: threading.Event) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_post("/chat/completions", self._chat)
        app.router.add_get("/v1/models", self._models)
        # handler_cancellation: a client that disconnects cancels its handler, so the
        # in-flight count shows requests really closed by the client.
        self._runner = web.AppRunner(app, handler_cancellation=True, access_log=None)
        loop.run_until_complete(self._runner.setup())
        site = web.TCPSite(self._runner, self.host, self.port, backlog=1024)
        loop.run_until_complete(site.start())
        self.port = site._server.sockets[0].getsockname()[1]
        ready.set()
        loop.run_forever()
        loop.close()

    # -- handlers -----------------------------------------------------------------------
    async def _models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": []})

    async def _chat(self, request: web.Request) -> web.Response:
        body = await request.json()
        with self._lock:
            self.requests.append(body)
            self.in_flight += 1
            self.peak_in_flight = max(self.peak_in_flight, self.in_flight)
            failure = self._take_failure(body)
        try:
            if failure == "hang":
                await asyncio.sleep(3600)
            delay = (self.latency_for(body) if self.latency_for else
                     self.model_latency.get(body.get("model"), self.latency))
            if delay:
                await asyncio.sleep(delay)
            if failure == "500":
                return web.json_response({"error": {"message": "injected server error",
                                                    "type": "server_error"}}, status=500)
            if failure == "401":
                return web.json_response({"error": {"message": "injected bad API key",
                                                    "type": "invalid_request_error"}},
                                         status=401)
            if failure == "429":
                return web.json_response({"error": {"message": "injected rate limit",
                                                    "type": "rate_limit_error"}},
                                         status=429)
            text = self._reply_for(body)
            with self._lock:
                self.completed += 1
            return web.json_response(self._completion(body, text))
        except asyncio.CancelledError:
            with self._lock:
                self.cancelled += 1
            raise
        finally:
            with self._lock:
                self.in_flight -= 1

    def _take_failure(self, body: dict) -> str | None:
        for failure in self.failures:
            if failure.times > 0 and failure.applies(body):
                failure.times -= 1
                return failure.kind
        return None

    def _reply_for(self, body: dict) -> str:
        model = body.get("model", "")
        with self._lock:
            queue = self.scripts.get(model)
            reply = queue.popleft() if queue else None
        if reply is None:
            reply = self.model_replies.get(model, self.default_reply)
        return reply(body) if callable(reply) else reply

    def _completion(self, body: dict, text: str) -> dict:
        prompt_tokens, completion_tokens = self.usage
        return {
            "id": f"chatcmpl-{len(self.requests)}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": body.get("model", "unknown"),
            "choices": [{"index": 0, "finish_reason": "stop",
                         "message": {"role": "assistant", "content": text}}],
            "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                      "total_tokens": prompt_tokens + completion_tokens},
        }


def main() -> None:  # pragma: no cover - for trying the server by hand
    import argparse

    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--latency", type=float, default=0.0)
    args = parser.parse_args()
    server = FakeLLMServer(port=args.port).start()
    server.latency = args.latency
    print(server.base_url, flush=True)
    threading.Event().wait()


if __name__ == "__main__":
    main()
