"""The litellm transport: ``litellm.acompletion`` for every provider litellm knows
(or a Router's ``acompletion``, see ``router``), always on the caller's running loop.

litellm caches its async HTTP clients per event loop, so a call on a second loop would
break them; the blocking ``litellm.completion`` is never used.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from ..messages import Messages
from ..pricing import cost_of_response
from ..prompt_cache import cache_figures
from ..streaming import StreamState, stream_completion
from .base import Answer, Request
from .wire import sessions

# How many times a request that met a closed kept-alive connection goes again at once.
STALE_RESENDS = 3


class LiteLLMTransport:
    """Calls ``send`` (``litellm.acompletion`` or ``Router.acompletion``)."""

    name = "litellm"
    # litellm's requests go out on the wire transport's sessions (``shared_session``),
    # which tell whether a connection was reused: a kept-alive one the server closed
    # before the request went out is then reopened, as on the wire. (A Router builds
    # its deployments' clients itself.)
    shares_sessions = True

    def __init__(self, send: Callable[..., Awaitable[Any]], litellm: Any):
        self.send, self.litellm = send, litellm

    async def complete(self, request: Request, messages: Messages | None = None) -> Answer:
        return self._answer(await self._sent(**request), None)

    async def _sent(self, **request: Any) -> Any:
        """``send``'s response; a request that met a kept-alive connection the server
        had closed (it failed before any byte of an answer) goes again, and not as a
        retry: see ``WireTransport._post``. litellm keeps the client it made with the
        first session it was given, so it goes on the same pool, which has dropped that
        connection: a few times at most, as the pool may hold more that were closed."""
        if not self.shares_sessions or "shared_session" in request:
            return await self.send(**request)
        for _ in range(STALE_RESENDS):
            sessions.forget_connection()
            try:
                return await self.send(**request, shared_session=sessions.session())
            except Exception as exc:
                if not (sessions.reused_connection() and sessions.closed_unanswered(exc)):
                    raise
        sessions.forget_connection()
        return await self.send(**request, shared_session=sessions.session())

    async def stream(
        self,
        request: Request,
        state: StreamState,
        *,
        stall_timeout: float,
        deadline: float | None,
        messages: Messages | None = None,
    ) -> Answer:
        # The stream carries the headers; its chunks, built into one response, carry the
        # text and usage.
        raw = await stream_completion(
            self._sent, request, state, stall_timeout=stall_timeout, deadline=deadline
        )
        response = state.response(self.litellm, messages) or raw
        return self._answer(response, _response_headers(raw))

    def partial(self, state: StreamState | None, messages: Messages | None) -> Answer | None:
        if state is None or not state.received:
            return None
        response = state.response(self.litellm, messages)
        return None if response is None else self._answer(response, None)

    def _answer(self, response: Any, headers: Mapping[str, Any] | None) -> Answer:
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
            cost_of_response(response, self.litellm),
            headers if headers is not None else _response_headers(response),
        )


def _response_headers(response: Any) -> Mapping[str, Any] | None:
    hidden = getattr(response, "_hidden_params", None) or {}
    headers: Mapping[str, Any] | None = hidden.get("additional_headers")
    return headers
