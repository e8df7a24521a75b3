"""Reading a streamed answer, in one pass from bytes to pieces: the body's network-sized
reads are split into server-sent events, each event's JSON is decoded once, and its
text is handed to the call's ``StreamState`` right there, with no object per chunk
and nothing read twice.

Bounds (a broken or hostile server costs bounded memory and time): a line (an event:
each ``data:`` line is one) is held until its newline only up to ``MAX_LINE`` bytes,
each byte joined and split once however many reads it spans; lines that are no event
(comments, ``event:``, blank lines) are skipped as they come. How long a stream may
take is the stall watch's business (``streaming.StallWatch``), which every read
touches.
"""

from __future__ import annotations

import asyncio
import json
import weakref
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .errors import APIConnectionError, connection_error, event_error
from .parsing import completion_parts

if TYPE_CHECKING:
    from ...streaming import StreamState

STREAM_ENDED = "Stream ended before a finish_reason was received"
# Above any real event (a server that sends a whole answer as one event included), and
# a bound on what one stream may make the kernel hold: past it, a broken (or hostile)
# stream, not an answer.
MAX_LINE = 16 << 20
# Seconds a whole answer's body may take to end (its last bytes come right after [DONE])
# before its connection is dropped rather than pooled.
END_GRACE_S = 1.0
_DONE = b"[DONE]"


async def read(reply: Any, state: StreamState, touch: Callable[[], None], api_base: str) -> bool:
    """Read ``reply`` (an aiohttp ClientResponse, its status read) to its end into
    ``state``; True when the answer ended as it should ([DONE], or a whole JSON answer
    from a server that ignores ``stream``): its connection may be pooled (``let_go``).
    Raises the litellm-named errors the client retries on: a connection that failed,
    a malformed event, a stream that ended before its finish reason."""
    import aiohttp

    headers = reply.headers
    done = False
    try:
        if reply.content_type == "application/json":
            # A server that ignores ``stream``: its whole answer at once.
            raw = await reply.read()
            touch()
            text, state.finish, state.usage = completion_parts(raw, headers, api_base)
            if text:
                state.add_text(text)
            return True
        done = await _events(reply, state, touch, api_base)
    except aiohttp.ClientError as exc:
        raise connection_error(exc, api_base) from exc
    except (ValueError, AttributeError, TypeError, KeyError, IndexError) as exc:
        # An event that is no chunk (bad JSON, ``data: 1``): litellm's connection error,
        # so the call is retried.
        raise APIConnectionError(
            f"the endpoint sent a malformed stream event ({type(exc).__name__}: {str(exc)[:200]})",
            None,
            headers,
            api_base,
        ) from None
    if not done and state.finish is None:
        raise APIConnectionError(STREAM_ENDED, None, headers, api_base)
    return done


async def _events(reply: Any, state: StreamState, touch: Callable[[], None], api_base: str) -> bool:
    """The body's events, each handed on as it completes; True at [DONE]."""
    loads = json.loads
    # A line's pieces until its newline comes: each byte is joined and split once (a
    # long line is not copied again with every read), and a line is bounded.
    pending: list[bytes] = []
    pending_size = 0
    async for data in reply.content.iter_any():
        touch()
        if pending:  # a line began in an earlier read
            pending.append(data)
            pending_size += len(data)
            if b"\n" not in data:
                if pending_size > MAX_LINE:
                    raise _too_long(reply, api_base)
                continue
            data = b"".join(pending)
            pending = []
        lines = data.split(b"\n")
        rest = lines.pop()
        if rest:
            pending.append(rest)
            pending_size = len(rest)
            if pending_size > MAX_LINE:
                raise _too_long(reply, api_base)
        for line in lines:
            if not line.startswith(b"data:"):
                continue
            payload = line[5:].strip()
            if payload == _DONE:
                return True
            # (decoded here: json.loads of bytes first guesses their encoding)
            _take(loads(payload.decode("utf-8", "surrogatepass")), state, reply, api_base)
    return False


def _take(event: Any, state: StreamState, reply: Any, api_base: str) -> None:
    """One event's text, finish reason and usage into ``state``; its error raised."""
    choices = event.get("choices")
    if choices:
        choice = choices[0]
        delta = choice.get("delta")
        if delta:
            piece = delta.get("content")
            if piece:
                state.add_text(piece)
        if choice.get("finish_reason"):
            state.finish = choice["finish_reason"]
    if event.get("usage"):
        state.usage = event["usage"]
    if "error" in event:
        raise event_error(event, reply.headers, api_base)


def _too_long(reply: Any, api_base: str) -> APIConnectionError:
    return APIConnectionError(
        f"the endpoint sent a stream line over {MAX_LINE} bytes",
        None,
        reply.headers,
        api_base,
    )


def let_go(reply: Any, done: bool) -> None:
    """Release or drop ``reply``'s connection, at once (nothing awaited: an interrupt
    cannot land in the middle). ``done``: ``read`` said the answer ended."""
    if not done:
        # Mid-answer (cut off, abandoned): dropped, so the server stops generating
        # and no connection goes back to the pool with an answer still on it.
        reply.close()
    elif reply.content.is_eof():
        reply.release()  # read to its end: the connection goes back to the pool
    else:
        # Whole, but the body's last bytes (the chunked end after [DONE]) are still
        # on their way: aiohttp pools the connection when they come, and what has
        # not ended by then is dropped.
        _Ending.of_running_loop().add(reply)


class _Ending:
    """A loop's replies whose body's end is on its way: each closed ``END_GRACE_S``
    after it was let go (a no-op for one pooled meanwhile), by one timer for all of
    them rather than a timer each (most answers end this way)."""

    _LOOPS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Ending] = (
        weakref.WeakKeyDictionary()
    )

    def __init__(self) -> None:  # (no reference to its loop: the registry is weak)
        self.replies: deque[tuple[float, Any]] = deque()
        self.timer: asyncio.TimerHandle | None = None

    @classmethod
    def of_running_loop(cls) -> _Ending:
        loop = asyncio.get_running_loop()
        ending = cls._LOOPS.get(loop)
        if ending is None:
            ending = cls._LOOPS[loop] = cls()
        return ending

    def add(self, reply: Any) -> None:
        loop = asyncio.get_running_loop()
        due = loop.time() + END_GRACE_S
        self.replies.append((due, reply))
        if self.timer is None:
            self.timer = loop.call_at(due, self._close_due)

    def _close_due(self) -> None:
        loop, replies = asyncio.get_running_loop(), self.replies
        now = loop.time()
        while replies and replies[0][0] <= now:
            replies.popleft()[1].close()
        self.timer = loop.call_at(replies[0][0], self._close_due) if replies else None
