"""Streamed completions: the text arrives chunk by chunk, so a slow model is watched for
stalls instead of being cut off at a total length, and whatever arrived before a cancel
or a stall is still counted.

The per-chunk path is kept cheap (it runs on the kernel's loop, once per token): a
piece of text is appended to a list and the stall timer is pushed back; joining the
text, counting tokens and pricing happen once, at the end (``StreamState.response``).
Under a cost budget, a piece's length is added up too: an answer past what its budget
holds for it holds more, or is cut (``budget.Reservation.more``).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from types import TracebackType
from typing import Any, Protocol

from ..errors import StreamStalled

# Called with each piece of streamed text; with None when a retry starts the answer over.
OnText = Callable[[str | None], None]


class Watch(Protocol):
    """What holds an answer to its cost budget (``budget.Reservation``)."""

    def first_limit(self) -> int: ...

    def more(self, text: str) -> int: ...


class StreamState:
    """What a streamed attempt has received so far; survives any failure."""

    def __init__(self, on_text: OnText | None = None, watch: Watch | None = None):
        self.on_text = on_text
        self.watch = watch  # a cost budget's hold on the answer, if any
        self._characters = 0
        self._limit = watch.first_limit() if watch is not None else 0
        self.chunks: list[Any] = []
        self._pieces: list[str] = []
        self.first_token_at: float | None = None
        # Set by the wire transport, which hands on text, not chunk objects.
        self.finish: str | None = None
        self.usage: dict[str, Any] | None = None
        # Asked before the first token, when the stall timer runs out: whether the
        # server reports work in progress (a local server queues requests past its
        # slots); while it does, the wait is no stall (set by ``slots.held``).
        self.server_busy: Callable[[], Awaitable[bool]] | None = None
        # Seconds the stream may take to open, when more than the stall timeout: a
        # Router fails over between deployments before its stream opens, each of its
        # attempts timed by the request's own timeout (set by the client).
        self.open_within: float | None = None

    def add(self, chunk: Any) -> None:
        self.chunks.append(chunk)
        choices = getattr(chunk, "choices", None)
        piece = getattr(choices[0].delta, "content", None) if choices else None
        if piece:
            if self.first_token_at is None:
                self.first_token_at = time.perf_counter()
            self._pieces.append(piece)
            if self.on_text is not None:
                self.on_text(piece)
            if self.watch is not None:
                self._watched(piece)

    def add_text(self, piece: str) -> None:
        """One piece of streamed text (the wire transport's path: no chunk objects)."""
        if self.first_token_at is None:
            self.first_token_at = time.perf_counter()
        self._pieces.append(piece)
        if self.on_text is not None:
            self.on_text(piece)
        if self.watch is not None:
            self._watched(piece)

    def _watched(self, piece: str) -> None:
        """Past what is held for it, the answer holds more or stops here (raises
        ``AnswerOverBudget``, after the piece is kept)."""
        self._characters += len(piece)
        if self._characters > self._limit and self.watch is not None:
            self._limit = self.watch.more(self.text)

    @property
    def text(self) -> str:
        return "".join(self._pieces)

    @property
    def finish_reason(self) -> str | None:
        """Why the answer ended, as the last chunk that says so tells."""
        if self.finish is not None:
            return self.finish
        for chunk in reversed(self.chunks[-4:]):
            choices = getattr(chunk, "choices", None) or []
            reason: str | None = getattr(choices[0], "finish_reason", None) if choices else None
            if reason:
                return reason
        return None

    @property
    def received(self) -> bool:
        return bool(self._pieces)

    def response(self, litellm: Any, messages: list[dict[str, Any]] | None) -> Any:
        """The whole (or partial) answer as one ModelResponse, with usage: the
        provider's when it sent it, else counted by litellm's tokenizer."""
        if not self.chunks:
            return None
        usage = next(
            (c.usage for c in reversed(self.chunks[-3:]) if getattr(c, "usage", None)), None
        )
        try:
            if usage is None:
                # litellm's builder counts the tokens (it walks every chunk: ~0.1 ms
                # each, so only when the provider left usage out).
                return litellm.stream_chunk_builder(self.chunks, messages=messages)
            return litellm.ModelResponse(
                model=getattr(self.chunks[-1], "model", None),
                choices=[
                    {
                        "index": 0,
                        "finish_reason": self.finish_reason or "stop",
                        "message": {"role": "assistant", "content": self.text},
                    }
                ],
                usage=usage,
            )
        except Exception:  # noqa: BLE001 - a partial stream litellm cannot assemble
            return None


async def stream_completion(
    acompletion: Callable[..., Awaitable[Any]],
    request: dict[str, Any],
    state: StreamState,
    *,
    stall_timeout: float,
    deadline: float | None = None,
) -> Any:
    """Run one streamed request of litellm's to its end, feeding ``state`` (which then
    holds the chunks, the text and usage); returns the stream, for its headers. Raises
    ``StreamStalled`` when no chunk comes for ``stall_timeout`` seconds or ``deadline``
    (``time.monotonic()``) passes; the connection is closed at once on any exit, an
    interrupt included. Before the first token, a server that reports work in progress
    (``state.server_busy``) is not stalled: it has queued the request."""
    request = {**request, "stream": True, "stream_options": {"include_usage": True}}
    if state.open_within is None:
        # The HTTP client's own read timeout stays out of the way of the stall watch,
        # which says what happened in words. (A Router's attempts keep theirs: it
        # fails over when one runs out.)
        request["timeout"] = stall_timeout + 5.0
    stream = None
    watch = StallWatch(stall_timeout, deadline, state)
    try:
        async with watch:
            stream = await acompletion(**request)
            watch.opened()
            async for chunk in stream:
                watch.touch()
                state.add(chunk)
    finally:
        if stream is not None:
            close = getattr(stream, "aclose", None)
            if close is not None:
                try:
                    await asyncio.shield(close())
                except Exception:  # noqa: BLE001 - closing must not mask the cause
                    pass  # (an interrupt during the close is no Exception: it goes on up)
    return stream


class StallWatch:
    """Cancels the streaming task when no chunk came for ``seconds``, or at
    ``deadline``, and raises ``StreamStalled`` in its place (a cancel from anyone else
    goes on as it came). One timer, re-armed lazily: a chunk only stores a timestamp.
    Before the first token, the server is asked first whether it is working, if it can
    say (``StreamState.server_busy``): while it is, the wait starts over. Used by both
    transports: litellm's (``stream_completion``) and the wire's, which reads its bytes
    under it (``transports.wire.sse``)."""

    def __init__(self, seconds: float, deadline: float | None, state: StreamState | None = None):
        self.deadline = deadline
        self.state = state
        self.stall_seconds = seconds
        opening = state.open_within if state is not None else None
        self.seconds = max(seconds, opening) if opening is not None else seconds
        self.expired = False
        self._at_deadline = False
        self._asking: asyncio.Future[None] | None = None

    def touch(self) -> None:
        self.last = time.monotonic()

    def opened(self) -> None:
        """The stream is open: from now on, the stall timeout counts."""
        self.seconds = self.stall_seconds
        self.touch()

    async def __aenter__(self) -> StallWatch:
        self.loop = asyncio.get_running_loop()
        task = asyncio.current_task()
        if task is None:  # a stream is always read by a task; the watch cancels it
            raise RuntimeError("a streamed answer must be read inside an asyncio task")
        self.task = task
        self.touch()
        self._cancels = _cancelling(self.task)
        self._handle = self.loop.call_later(self._next_check(), self._check)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool:
        self._handle.cancel()
        if self._asking is not None:
            self._asking.cancel()
        if self.expired and exc_type is asyncio.CancelledError:
            # Our own cancel, not the user's: turn it into a timeout.
            uncancel = getattr(self.task, "uncancel", None)
            if uncancel is not None:
                uncancel()
            if _cancelling(self.task) <= self._cancels:
                raise StreamStalled(self.reason()) from None
        return False

    def _next_check(self) -> float:
        now = time.monotonic()
        due = self.last + self.seconds
        if self.deadline is not None:
            due = min(due, self.deadline)
        return max(0.0, due - now)

    def _check(self) -> None:
        now = time.monotonic()
        if self.deadline is not None and now >= self.deadline:
            self._at_deadline = True
        if self._at_deadline:
            self._expire()
        elif now - self.last >= self.seconds:
            state = self.state
            if state is not None and state.server_busy is not None and not state.received:
                self._asking = asyncio.ensure_future(self._ask_if_queued(state.server_busy))
            else:
                self._expire()
        else:
            self._handle = self.loop.call_later(self._next_check(), self._check)

    async def _ask_if_queued(self, server_busy: Callable[[], Awaitable[bool]]) -> None:
        """No first token yet: a server at work has the request queued (not a stall),
        and the wait starts over; else it stalled."""
        try:
            busy = await asyncio.wait_for(server_busy(), max(1.0, min(5.0, self.seconds)))
        except asyncio.CancelledError:
            raise
        except Exception:  # noqa: BLE001 - a server that cannot say: a stall is a stall
            busy = False
        now = time.monotonic()
        if busy:
            self.touch()
        if self.deadline is not None and now >= self.deadline:
            self._at_deadline = True
        if self._at_deadline or now - self.last >= self.seconds:
            self._expire()
        else:
            self._handle = self.loop.call_later(self._next_check(), self._check)

    def _expire(self) -> None:
        self.expired = True
        self.task.cancel()

    def reason(self) -> str:
        if self._at_deadline:
            return "the step's time ran out while the answer was streaming"
        if self.seconds > self.stall_seconds:  # (not opened yet: a Router's failovers)
            return f"no answer began within {self.seconds:g}s"
        return f"no new tokens for {self.seconds:g}s"


def _cancelling(task: asyncio.Task[Any]) -> int:
    counter = getattr(task, "cancelling", None)  # Python 3.11+
    return counter() if counter is not None else 0
