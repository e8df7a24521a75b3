"""A local OpenAI-compatible chat server for tests and benchmarks.

It speaks the same wire format as the demo model (``rlm_magic.demo.LocalChatServer``)
and runs in a thread with its own event loop on 127.0.0.1, so tests on any loop, or a
kernel in another process, reach it over real HTTP. It scripts replies per model, adds
latency, injects failures (500, 429, 401, a hang) and records every request and the
peak number in flight.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import defaultdict, deque
from dataclasses import dataclass
from typing import Callable, Union

from rlm_magic.demo import HTTPError, LocalChatServer

Reply = Union[str, Callable[[dict], str]]

_FAILURES = {
    "500": (500, "injected server error", "server_error"),
    "429": (429, "injected rate limit", "rate_limit_error"),
    "401": (401, "injected bad API key", "invalid_request_error"),
    # llama.cpp's answer to a prompt over its context size
    "context": (400, "request (23009 tokens) exceeds the available context size (4096 "
                "tokens), try increasing it", "exceed_context_size_error"),
}


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

    def applies(self, body: dict) -> bool:
        if self.model is not None and body.get("model") != self.model:
            return False
        if self.match is not None and self.match not in body["messages"][-1]["content"]:
            return False
        if self.after > 0:
            self.after -= 1
            return False
        return True


class FakeLLMServer(LocalChatServer):
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
             match: str | None = None, after: int = 0) -> None:
        assert kind in (*_FAILURES, "hang")
        with self._lock:
            self.failures.append(Failure(kind, times, model, match, after))

    def requests_for(self, model: str) -> list[dict]:
        return [r for r in self.requests if r.get("model") == model]

    def wait_for(self, predicate: Callable[[], bool], timeout: float = 5.0) -> bool:
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
            if failure is not None:
                raise HTTPError(*_FAILURES[failure])
            text = self._reply_for(body)
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

    def usage_for(self, body: dict, text: str) -> tuple[int, int]:
        return self.usage

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


def main() -> None:
    """Serve on its own (benchmarks run it in a separate process): prints its URL."""
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--latency", type=float, default=0.0)
    args = parser.parse_args()
    server = FakeLLMServer(port=args.port).start()
    server.latency = args.latency
    server.requests = _Discard()  # a long benchmark must not grow memory
    print(server.base_url, flush=True)
    threading.Event().wait()


class _Discard(list):
    def append(self, item) -> None:
        pass


if __name__ == "__main__":
    main()
