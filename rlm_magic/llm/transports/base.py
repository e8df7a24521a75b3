"""The transport seam: how one chat request reaches a model, behind one small interface.

``LLMClient`` owns what every call shares (the gate, retries, cache, ledger, redaction);
a transport only sends a request and hands back an ``Answer``: text, usage, cost and the
response's headers. Its failures are exceptions the client reads the same way whichever
transport raised them: a ``status_code``, the response's headers, litellm's class names
(``RateLimitError``, ``APIConnectionError``...). Any object with these methods is a
transport: the tests plug in a scripted one.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from ..messages import Messages
from ..streaming import StreamState

# A chat request as litellm takes it: model, messages, timeout, max_retries and the
# parameters (max_tokens, temperature, response_format...); api_base and api_key
# when the endpoint is the user's own.
Request = dict[str, Any]


@dataclass(frozen=True, slots=True)
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


class Transport(Protocol):
    """Sends requests to one model (or one Router configuration)."""

    # "litellm", "wire" or "router": what status lines and tests name it by.
    name: str

    async def complete(self, request: Request, messages: Messages | None = None) -> Answer:
        """The whole answer at once. ``messages``: the conversation as the caller gave it
        (``request`` may carry a copy marked for the provider's prompt cache), for
        counting tokens when a provider sends no usage."""
        ...

    async def stream(
        self,
        request: Request,
        state: StreamState,
        *,
        stall_timeout: float,
        deadline: float | None,
        messages: Messages | None = None,
    ) -> Answer:
        """The answer streamed into ``state`` (which keeps what arrived, whatever
        happens); raises ``StreamStalled`` when no token comes for ``stall_timeout``
        seconds or ``deadline`` (``time.monotonic()``) passes."""
        ...

    def partial(self, state: StreamState | None, messages: Messages | None) -> Answer | None:
        """What a broken-off stream received, priced (it is billed all the same);
        None when nothing arrived."""
        ...
