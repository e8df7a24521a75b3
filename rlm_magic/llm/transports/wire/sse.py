"""Reading a streamed answer: server-sent events in network-sized pieces, each piece
split into events and each event's text handed on, with no object per chunk."""

from __future__ import annotations

import asyncio
import json
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


class WireStream:
    """An open server-sent-events answer, read in network-sized pieces: each piece is
    split into events and each event's text handed on, with no object per chunk."""

    def __init__(self, reply: Any, api_base: str):  # reply: an aiohttp ClientResponse
        self.reply, self.headers, self.api_base = reply, reply.headers, api_base
        self.done = False

    async def pump(self, state: StreamState, touch: Callable[[], None]) -> None:
        import aiohttp

        try:
            if self.reply.content_type == "application/json":
                # A server that ignores ``stream``: its whole answer at once.
                raw = await self.reply.read()
                touch()
                text, state.finish, state.usage = completion_parts(raw, self.headers, self.api_base)
                if text:
                    state.add_text(text)
                self.done = True
                return
            await self._events(state, touch)
        except aiohttp.ClientError as exc:
            raise connection_error(exc, self.api_base) from exc
        except (ValueError, AttributeError, TypeError, KeyError, IndexError) as exc:
            # An event that is no chunk (bad JSON, ``data: 1``): litellm's connection
            # error, so the call is retried.
            raise APIConnectionError(
                f"the endpoint sent a malformed stream event "
                f"({type(exc).__name__}: {str(exc)[:200]})",
                None,
                self.headers,
                self.api_base,
            ) from None
        if not self.done and state.finish is None:
            raise APIConnectionError(STREAM_ENDED, None, self.headers, self.api_base)

    async def _events(self, state: StreamState, touch: Callable[[], None]) -> None:
        loads, add = json.loads, state.add_text
        # A line's pieces until its newline comes: each byte is joined and split once
        # (a long line is not copied again with every read), and a line is bounded.
        pending: list[bytes] = []
        pending_size = 0
        async for data in self.reply.content.iter_any():
            touch()
            if pending:  # a line began in an earlier read
                pending.append(data)
                pending_size += len(data)
                if b"\n" not in data:
                    if pending_size > MAX_LINE:
                        raise self._too_long()
                    continue
                data = b"".join(pending)
                pending = []
            lines = data.split(b"\n")
            rest = lines.pop()
            if rest:
                pending.append(rest)
                pending_size = len(rest)
                if pending_size > MAX_LINE:
                    raise self._too_long()
            for line in lines:
                if not line.startswith(b"data:"):
                    continue
                payload = line[5:].strip()
                if payload == b"[DONE]":
                    self.done = True
                    return
                # (decoded here: json.loads of bytes first guesses their encoding)
                event = loads(payload.decode("utf-8", "surrogatepass"))
                choices = event.get("choices")
                if choices:
                    choice = choices[0]
                    delta = choice.get("delta")
                    if delta:
                        piece = delta.get("content")
                        if piece:
                            add(piece)
                    if choice.get("finish_reason"):
                        state.finish = choice["finish_reason"]
                if event.get("usage"):
                    state.usage = event["usage"]
                if "error" in event:
                    raise event_error(event, self.headers, self.api_base)

    def _too_long(self) -> APIConnectionError:
        return APIConnectionError(
            f"the endpoint sent a stream line over {MAX_LINE} bytes",
            None,
            self.headers,
            self.api_base,
        )

    def aclose(self) -> asyncio.Future[None]:
        """Release or drop the connection; awaitable, and already done (the caller
        shields it from cancellation: a coroutine would cost a task per answer)."""
        reply = self.reply
        if not self.done:
            # Mid-answer (cut off, abandoned): dropped, so the server stops generating
            # and no connection goes back to the pool with an answer still on it.
            reply.close()
        elif reply.content.is_eof():
            reply.release()  # read to its end: the connection goes back to the pool
        else:
            # Whole, but the body's last bytes (the chunked end after [DONE]) are still
            # on their way: aiohttp pools the connection when they come, and what has
            # not ended by then is dropped.
            asyncio.get_running_loop().call_later(END_GRACE_S, reply.close)
        done = asyncio.get_running_loop().create_future()
        done.set_result(None)
        return done
