"""A resumable map cut off as an interrupt cuts it, and what it kept on disk."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from .rlms import helpers


def maps_in(tmp_path) -> list:
    return list((tmp_path / "maps").glob("*.jsonl")) if (tmp_path / "maps").is_dir() else []


def lines_kept(cache_dir) -> int:
    return sum(len(path.read_text().splitlines()) for path in maps_in(Path(cache_dir)))


async def interrupted_after(rlm, server, prompts, answered: int, **options):
    """Run the map until ``answered`` answers are kept on disk, then cancel it as an
    interrupt would."""
    task = asyncio.ensure_future(helpers(rlm).llm_query_batch(prompts, **options))
    for _ in range(3000):  # up to 30 s: a cold litellm import, a loaded machine
        if lines_kept(rlm.cache_dir) >= answered:
            break
        await asyncio.sleep(0.01)
    assert lines_kept(rlm.cache_dir) == answered
    # Every request in flight has reached the server, so none of this run's arrives
    # after the test has reset the server's record for the re-run.
    sent = min(len(prompts), rlm.max_concurrency)
    assert await asyncio.to_thread(server.wait_for, lambda: len(server.requests) >= sent, 30)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
