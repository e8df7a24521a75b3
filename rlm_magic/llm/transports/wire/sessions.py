"""The wire transport's HTTP sessions: one aiohttp session per event loop, since its
connections belong to the loop that made them, closed when that loop ends."""

from __future__ import annotations

import asyncio
import json
import weakref
from collections.abc import AsyncGenerator
from typing import Any

from ...litellm_loader import ssl_context

# Each loop's (aiohttp session, the generator that closes it with the loop).
_SESSIONS: weakref.WeakKeyDictionary[
    asyncio.AbstractEventLoop, tuple[Any, AsyncGenerator[None, None]]
] = weakref.WeakKeyDictionary()


def session() -> Any:
    """This loop's aiohttp session: its connections belong to the loop that made them."""
    loop = asyncio.get_running_loop()
    entry = _SESSIONS.get(loop)
    if entry is None or entry[0].closed:
        import aiohttp

        connector = aiohttp.TCPConnector(limit=0, ssl=ssl_context(), ttl_dns_cache=300)
        session = aiohttp.ClientSession(
            connector=connector,  # proxies: per route (``Route.proxy``)
            timeout=aiohttp.ClientTimeout(total=None),  # ours: wait_for, the stall watch
            json_serialize=json.dumps,
        )
        closer = _closed_with_loop(loop, session)
        try:  # started, so the loop knows it: asyncio.run closes it when the loop ends
            closer.__anext__().send(None)
        except StopIteration:
            pass
        _SESSIONS[loop] = entry = (session, closer)
    return entry[0]


async def _closed_with_loop(
    loop: asyncio.AbstractEventLoop, session: Any
) -> AsyncGenerator[None, None]:
    """Closes ``session`` when its loop shuts down (``asyncio.run`` closes every open
    async generator then), for scripts that never call ``close_loop_clients``: an
    unclosed session would complain at exit, and keep its loop alive until then."""
    try:
        yield
    finally:
        if _SESSIONS.get(loop, (None,))[0] is session:
            del _SESSIONS[loop]
        if not session.closed:
            await session.close()


async def close_sessions() -> None:
    """Close the running loop's session (before the loop ends)."""
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        return
    entry = _SESSIONS.pop(loop, None)
    if entry is not None:
        await entry[1].aclose()  # closes the session
        # The sockets close in the loop's next turns: a loop that ends now (asyncio.run)
        # would never run them, and each run would leave its connections open.
        await asyncio.sleep(0)
        await asyncio.sleep(0)
