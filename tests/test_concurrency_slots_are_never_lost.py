"""The concurrency limiter and the batch runner never lose a slot."""

from __future__ import annotations

import asyncio

import pytest

from rlm_magic.llm.limiter import ConcurrencyLimiter
from rlm_magic.maps.gather import gather_limited


async def test_a_batch_cancelled_before_its_tasks_start_releases_every_slot():
    limiter = ConcurrencyLimiter(lambda: 8)

    async def slow():
        await asyncio.sleep(10)

    batch = asyncio.ensure_future(gather_limited([slow] * 3, limiter))
    await asyncio.sleep(0)  # the batch has started its tasks, which have not yet run
    batch.cancel()
    with pytest.raises(asyncio.CancelledError):
        await batch
    assert limiter.holders == 0


async def test_a_waiter_cancelled_while_a_slot_frees_raises_cancelled_error():
    limiter = ConcurrencyLimiter(lambda: 1)
    await limiter.acquire()
    waiter = asyncio.ensure_future(limiter.acquire())
    await asyncio.sleep(0)  # now queued
    waiter.cancel()
    limiter.release()  # frees the slot before the cancelled waiter resumes
    with pytest.raises(asyncio.CancelledError):
        await waiter
    assert limiter.holders == 0


async def test_the_limit_is_read_at_every_acquire():
    limit = {"n": 1}
    limiter = ConcurrencyLimiter(lambda: limit["n"])
    await limiter.acquire()
    assert not limiter.has_free_slot()
    limit["n"] = 2
    assert limiter.has_free_slot()
