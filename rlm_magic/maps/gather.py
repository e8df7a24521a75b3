"""Running many calls concurrently under a shared limit, losing no result.

Tasks are started as limiter slots free up, a few per loop iteration, not all at
once: litellm spends milliseconds of CPU building each request, and starting 64 in one
loop iteration would stall timers, widgets and other tasks for that long.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Protocol

from ..llm.completion import Completion, partial_answer
from ..llm.limiter import ConcurrencyLimiter

# How many calls may start in one loop iteration: enough to fill the limit quickly,
# few enough that their request building (1-2 ms of CPU each) never stalls the loop long.
START_BURST = 8


class BatchObserver(Protocol):
    def item_started(self, index: int) -> None: ...
    def item_finished(self, index: int, result: Any) -> None: ...
    def item_failed(self, index: int, error: BaseException) -> None: ...


class BatchOutcome:
    """Where a batch's results land, as they arrive: a caller that keeps it still has
    every finished answer after an interrupt."""

    def __init__(self, size: int):
        self.results: list[Any] = [None] * size
        self.errors: dict[int, Exception] = {}
        # Calls an interrupt stopped mid-answer: what they had received (``Completion``s).
        self.partial: dict[int, Completion] = {}
        self.started: set[int] = set()  # calls that began (the rest were never sent)

    on_disk = False  # a batch's answers are kept only in memory (see run_map for maps)
    cut_by_interrupt = 0  # its answers() hold no part an interrupt cut (a map's do: run_map)

    def answers(self) -> list[Any]:
        """Each call's result, None where none has arrived."""
        return list(self.results)

    def failures(self) -> dict[int, Exception]:
        return dict(self.errors)

    def never_sent(self) -> list[int]:
        """The calls that never began (an interrupt came before their turn)."""
        return [i for i in range(len(self.results)) if i not in self.started]

    @property
    def finished(self) -> int:
        return sum(r is not None for r in self.results) + len(self.errors)


async def gather_limited(
    calls: Sequence[Callable[[], Awaitable[Any]]],
    limiter: ConcurrencyLimiter,
    observer: BatchObserver | None = None,
    outcome: BatchOutcome | None = None,
) -> tuple[list[Any], dict[int, Exception]]:
    """Run every call, at most as many at once as ``limiter`` admits.

    Returns ``(results, errors)``: ``results[i]`` is call i's value (None if it failed)
    and ``errors`` maps failed indices to their exceptions. One failure never stops the
    others. If the caller is cancelled, every started call is cancelled and awaited
    before the cancellation propagates, so nothing is left running; ``outcome``, if
    given, then holds the calls that had finished.
    """
    outcome = outcome or BatchOutcome(len(calls))
    results, errors = outcome.results, outcome.errors
    tasks: list[asyncio.Task[None]] = []

    def run(index: int) -> Awaitable[None]:
        return _run_one(calls[index], index, outcome, observer)

    try:
        started_this_turn = 0
        for index in range(len(calls)):
            await limiter.acquire()
            task = asyncio.ensure_future(run(index))
            # Released when the task ends, however it ends: a task cancelled before its
            # first step never runs its own code, and a lost slot would be lost for the
            # whole session.
            task.add_done_callback(lambda _: limiter.release())
            tasks.append(task)
            started_this_turn += 1
            if started_this_turn == START_BURST:
                await asyncio.sleep(0)  # let these take their first steps, then go on
                started_this_turn = 0
        if tasks:
            await asyncio.gather(*tasks)
    except BaseException:
        for task in tasks:
            task.cancel()
        # Wait for the cancelled calls to unwind, so no request outlives the batch.
        await asyncio.gather(*tasks, return_exceptions=True)
        raise
    return results, errors


async def _run_one(
    call: Callable[[], Awaitable[Any]],
    index: int,
    outcome: BatchOutcome,
    observer: BatchObserver | None,
) -> None:
    """Call ``index``: its value or its error kept in ``outcome``, and what had arrived
    when it was cancelled."""
    outcome.started.add(index)
    try:
        if observer:
            observer.item_started(index)
        outcome.results[index] = await call()
        if observer:
            observer.item_finished(index, outcome.results[index])
    except Exception as exc:  # noqa: BLE001 - kept per item, reported by the caller
        outcome.errors[index] = exc
        if observer:
            observer.item_failed(index, exc)
    except asyncio.CancelledError as cancel:
        cut = partial_answer(cancel)
        if cut is not None:
            outcome.partial[index] = cut
        raise
