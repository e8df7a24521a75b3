"""Waiting in a test for something another task or process does, without a fixed sleep."""

from __future__ import annotations

import asyncio
import time


async def eventually(predicate, timeout: float = 10.0) -> bool:
    """Whether ``predicate()`` held within ``timeout`` s, looked at every 20 ms while the
    loop goes on running the test's other tasks."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        await asyncio.sleep(0.02)
    return False
