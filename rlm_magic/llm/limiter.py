"""A concurrency limiter whose limit can change while it is in use.

``asyncio.Semaphore`` fixes its size at creation; ``%config RLM.max_concurrency = 4``
must take effect on the next request, so the limit is read at every acquire.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable


class ConcurrencyLimiter:
    """Admits at most ``limit()`` holders at once, first come first served."""

    def __init__(self, limit: Callable[[], int]):
        self._limit = limit
        self._holders = 0
        self._waiters: deque[asyncio.Future[None]] = deque()

    @property
    def holders(self) -> int:
        return self._holders

    def has_free_slot(self) -> bool:
        return self._holders < self._limit() and not self._waiters

    async def acquire(self) -> None:
        if self.has_free_slot():
            self._holders += 1
            return
        waiter = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            await waiter
        except BaseException:
            if waiter.done() and not waiter.cancelled():
                self.release()  # we were granted a slot while being cancelled: hand it on
            elif waiter in self._waiters:
                self._waiters.remove(waiter)
            raise

    def release(self) -> None:
        self._holders -= 1
        self._wake()

    def _wake(self) -> None:
        while self._waiters and self._holders < self._limit():
            waiter = self._waiters.popleft()
            if not waiter.done():
                self._holders += 1
                waiter.set_result(None)

    async def __aenter__(self) -> None:
        await self.acquire()

    async def __aexit__(self, *exc: object) -> None:
        self.release()
