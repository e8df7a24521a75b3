"""Transports: how one chat request reaches a model, behind one small interface.

``LLMClient`` owns what every call shares (the gate, retries, cache, ledger, redaction);
a transport only sends a request and hands back an ``Answer``: text, usage, cost and the
response's headers. Two exist:

- ``LiteLLMTransport``: ``litellm.acompletion`` (or a Router's), for every provider;
- ``openai_wire.WireTransport``: OpenAI-compatible endpoints straight over aiohttp, at a
  fifteenth of the CPU per call (``RLM.wire_transport``, on by default).

Both raise exceptions that ``client`` reads the same way (status code, headers, names).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Answer:
    """A response as the client needs it, whichever transport brought it."""

    text: str
    finish_reason: str | None
    input_tokens: int
    output_tokens: int
    cached_input_tokens: int
    cache_write_tokens: int
    cost_usd: float | None
    headers: Mapping[str, Any] | None  # for the rate gate


class LiteLLMTransport:
    """Calls ``send`` (``litellm.acompletion`` or ``Router.acompletion``)."""

    name = "litellm"

    def __init__(self, send, litellm):
        self.send, self.litellm = send, litellm

    async def complete(self, request: dict, messages=None) -> Answer:
        return self._answer(await self.send(**request), None)

    async def stream(
        self, request: dict, state, *, stall_timeout: float, deadline: float | None, messages=None
    ) -> Answer:
        from .streaming import stream_completion

        # The stream carries the headers; its chunks, built into one response, carry the
        # text and usage.
        raw = await stream_completion(
            self.send, request, state, stall_timeout=stall_timeout, deadline=deadline
        )
        response = state.response(self.litellm, messages) or raw
        return self._answer(response, _response_headers(raw))

    def partial(self, state, messages) -> Answer | None:
        if state is None or not state.received:
            return None
        response = state.response(self.litellm, messages)
        return None if response is None else self._answer(response, None)

    def _answer(self, response, headers) -> Answer:
        from .client import _cost_of
        from .prompt_cache import cache_figures

        choices = getattr(response, "choices", None) or [None]
        choice = choices[0]
        message = getattr(choice, "message", None)
        usage = getattr(response, "usage", None)
        read, written = cache_figures(usage)
        return Answer(
            getattr(message, "content", None) or "",
            getattr(choice, "finish_reason", None),
            int(getattr(usage, "prompt_tokens", 0) or 0),
            int(getattr(usage, "completion_tokens", 0) or 0),
            read,
            written,
            _cost_of(response, self.litellm),
            headers if headers is not None else _response_headers(response),
        )


def _response_headers(response) -> dict | None:
    hidden = getattr(response, "_hidden_params", None) or {}
    return hidden.get("additional_headers")


async def close_loop_sessions() -> None:
    """Close the wire transport's connections of the running loop."""
    from . import openai_wire

    await openai_wire.close_sessions()
