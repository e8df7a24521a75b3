"""The scripted transport: the seam every transport fills (``llm.transports.base.Transport``)
filled with a script, so a test of the client's rules (cache, retries, budgets, the
ledger) runs with no HTTP at all. Where HTTP is what a test is about, the local server
(``llm_server``) plays it instead."""

from __future__ import annotations

from types import SimpleNamespace

from rlm_magic.config import RLMConfig
from rlm_magic.llm.client import LLMClient
from rlm_magic.llm.transports.base import Answer

MODEL = "openai/scripted"


def answer(text: str = "fine", finish_reason: str = "stop") -> Answer:
    return Answer(text, finish_reason, 10, 2, 0, 0, 0.001, None)


class HTTPFailure(Exception):
    """A failed response, as both transports raise it: a status code and headers."""

    def __init__(self, status: int, headers: dict | None = None):
        super().__init__(f"HTTP {status}")
        self.status_code = status
        self.response = SimpleNamespace(headers=headers or {})


class BrokenOff(Exception):
    """A stream that sends ``text`` and then fails with ``failure``."""

    def __init__(self, text: str, failure: BaseException):
        super().__init__(text)
        self.text, self.failure = text, failure


class ScriptedTransport:
    """Answers from a script: each step an ``Answer``, an exception to raise, or (for a
    streamed call) ``BrokenOff``. Records every request it was given."""

    name = "scripted"

    def __init__(self, *steps):
        self.steps = list(steps)
        self.requests: list[dict] = []

    async def complete(self, request, messages=None):
        return self._next(request)

    async def stream(self, request, state, *, stall_timeout, deadline, messages=None):
        step = self.steps[0]
        if isinstance(step, BrokenOff):
            self._next(request, raise_it=False)
            state.add_text(step.text)
            raise step.failure
        found = self._next(request)
        state.add_text(found.text)
        return found

    def partial(self, state, messages):
        if state is None or not state.received:
            return None
        return Answer(state.text, None, 10, len(state.text) // 4, 0, 0, 0.0005, None)

    def _next(self, request, raise_it=True):
        self.requests.append(request)
        step = self.steps.pop(0)
        if raise_it and isinstance(step, BaseException):
            raise step
        return step


def scripted_client(*steps, **settings) -> tuple[LLMClient, ScriptedTransport]:
    transport = ScriptedTransport(*steps)
    config = RLMConfig(model=MODEL, retry_backoff=0.01, progress=False, **settings)
    return LLMClient(config, transport=transport), transport
