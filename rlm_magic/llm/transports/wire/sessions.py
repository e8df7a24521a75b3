"""The wire transport's HTTP sessions: one aiohttp session per event loop, since its
connections belong to the loop that made them, closed when that loop ends.

Kept-alive connections are reused with care. A server closes an idle connection when it
likes (llama.cpp, uvicorn and Node after 5 s idle, some servers after so many answers),
and says so only by closing it: a request written into such a connection as the close
crosses it is lost ("Can not write request body", "Server disconnected"). So a pooled
connection is dropped after ``KEEP_ALIVE_S`` idle (below those servers' 5 s), and a
request that still meets a closed one is sent again on a fresh connection
(``WireTransport._post``; ``reused_connection`` tells when that is safe). litellm's
requests go out on these sessions too (its ``shared_session``), so that the same is
known of them (``LiteLLMTransport._sent``).
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import json
import weakref
from collections.abc import AsyncGenerator
from typing import Any

from ...litellm_loader import ssl_context

# Idle seconds after which a pooled connection is not reused (aiohttp's default, 15 s,
# outlives the 5 s after which many servers close one; httpx keeps them 5 s).
KEEP_ALIVE_S = 4.0

_Registry = weakref.WeakKeyDictionary[
    asyncio.AbstractEventLoop, tuple[Any, AsyncGenerator[None, None]]
]
# Each loop's (aiohttp session, the generator that closes it with the loop).
_SESSIONS: _Registry = weakref.WeakKeyDictionary()
# Each loop's session for requests sent again: every connection new, closed after use.
_FRESH: _Registry = weakref.WeakKeyDictionary()
# Whether the connection the current task's last request went out on had carried a
# request before: a cell the connector fills as it hands one out. (A cell, not the flag:
# litellm may send from a task of its own, which sees the cell but sets in a copy.)
_REUSED: contextvars.ContextVar[list[bool] | None] = contextvars.ContextVar(
    "wire_reused", default=None
)


def reused_connection() -> bool:
    """Whether the current task's last request was written into a kept-alive connection
    (one that had carried a request before), rather than a new one."""
    cell = _REUSED.get()
    return bool(cell and cell[0])


def forget_connection() -> None:
    """Before a request: nothing is known of the connection it will go out on."""
    _REUSED.set([False])


def closed_unanswered(exc: BaseException) -> bool:
    """The connection failed before any byte of an answer came: the server closed it
    ("Server disconnected", a reset, "Can not write request body"), whatever wraps it
    (litellm's and the OpenAI SDK's errors keep aiohttp's as a cause). A connection
    that could not be opened is not one of these."""
    import aiohttp

    from ....errors import causes

    for link in causes(exc):
        if isinstance(link, aiohttp.ClientConnectorError):
            return False
        if isinstance(
            link, (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError, ConnectionResetError)
        ):
            return True
    return False


def session() -> Any:
    """This loop's aiohttp session: its connections belong to the loop that made them."""
    loop = asyncio.get_running_loop()
    entry = _SESSIONS.get(loop)
    if entry is None or entry[0].closed:
        connector = _connector_class()(
            limit=0, ssl=ssl_context(), ttl_dns_cache=300, keepalive_timeout=KEEP_ALIVE_S
        )
        entry = _SESSIONS[loop] = _opened(loop, connector, _SESSIONS)
    return entry[0]


def fresh_session() -> Any:
    """This loop's session whose every request goes out on a new connection."""
    loop = asyncio.get_running_loop()
    entry = _FRESH.get(loop)
    if entry is None or entry[0].closed:
        import aiohttp

        connector = aiohttp.TCPConnector(
            limit=0, ssl=ssl_context(), ttl_dns_cache=300, force_close=True
        )
        entry = _FRESH[loop] = _opened(loop, connector, _FRESH)
    return entry[0]


def _opened(
    loop: asyncio.AbstractEventLoop, connector: Any, registry: _Registry
) -> tuple[Any, AsyncGenerator[None, None]]:
    import aiohttp

    session = aiohttp.ClientSession(
        connector=connector,  # proxies: per route (``Route.proxy``)
        timeout=aiohttp.ClientTimeout(total=None),  # ours: wait_for, the stall watch
        json_serialize=json.dumps,
    )
    closer = _closed_with_loop(loop, session, registry)
    try:  # started, so the loop knows it: asyncio.run closes it when the loop ends
        closer.__anext__().send(None)
    except StopIteration:
        pass
    return session, closer


@functools.cache
def _connector_class() -> type:
    import aiohttp

    class TellingConnector(aiohttp.TCPConnector):  # type: ignore[misc]
        """Tells the sending task whether the connection it hands out carried a request
        before (``reused_connection``)."""

        async def connect(self, req: Any, traces: Any, timeout: Any) -> Any:
            connection = await super().connect(req, traces, timeout)
            protocol = connection.protocol
            cell = _REUSED.get()
            if protocol is not None:
                if cell is not None:
                    cell[0] = getattr(protocol, "wire_used", False)
                protocol.wire_used = True
            return connection

    return TellingConnector


async def _closed_with_loop(
    loop: asyncio.AbstractEventLoop, session: Any, registry: _Registry
) -> AsyncGenerator[None, None]:
    """Closes ``session`` when its loop shuts down (``asyncio.run`` closes every open
    async generator then), for scripts that never call ``close_loop_clients``: an
    unclosed session would complain at exit, and keep its loop alive until then."""
    try:
        yield
    finally:
        if registry.get(loop, (None,))[0] is session:
            del registry[loop]
        if not session.closed:
            await session.close()


async def close_sessions() -> None:
    """Close the running loop's session (before the loop ends)."""
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        return
    entries = [_SESSIONS.pop(loop, None), _FRESH.pop(loop, None)]
    for entry in entries:
        if entry is not None:
            await entry[1].aclose()  # closes the session
    if any(entries):
        # The sockets close in the loop's next turns: a loop that ends now (asyncio.run)
        # would never run them, and each run would leave its connections open.
        await asyncio.sleep(0)
        await asyncio.sleep(0)
