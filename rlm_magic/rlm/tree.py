"""The run tree: what a run shares with its child runs (``rlm_query``): one ledger, one
sub-call budget, one cost budget (held by the ledger: see ``llm.budget``), the child
sandboxes that may run at once, and the counts the status panel reads a few times a
second."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ..llm.budget import CostBudget
from ..llm.usage import UsageLedger

if TYPE_CHECKING:
    from .live_turn import LiveTurn


@dataclass
class RunTree:
    """What a run shares with its child runs: ledger, sub-call budget, and the counts
    the status panel shows (read by it a few times a second)."""

    ledger: UsageLedger
    max_sub_calls: int
    max_cost_usd: float | None
    sub_calls: int = 0
    in_flight: int = 0
    done: int = 0
    failed: int = 0
    phase: str = "starting"
    iteration: int = 0
    max_iterations: int = 0
    live_turn: LiveTurn | None = None  # the root turn streaming in, for the panel
    max_child_sandboxes: int = 4  # per depth, across the tree
    _sandbox_slots: dict[int, asyncio.Semaphore] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.max_cost_usd is not None:
            # Held by the tree's ledger: every call of the run and its children
            # (their records land there) is admitted against it before it is sent.
            self.ledger.budget = CostBudget(self.ledger, self.max_cost_usd, "max_cost_usd")

    def child_sandbox(self, depth: int) -> asyncio.Semaphore:
        """The slots of the child runs at ``depth`` that run in sandboxes, so the tree
        holds at most ``1 + max_child_sandboxes * max_depth`` sandboxes however wide a
        batch is. One set per depth: a child holds its slot while it waits for its own
        children's, and those are never held by a waiting run, so none deadlocks."""
        slots = self._sandbox_slots.get(depth)
        if slots is None:
            slots = self._sandbox_slots[depth] = asyncio.Semaphore(self.max_child_sandboxes)
        return slots

    def sub_calls_left(self) -> int:
        return self.max_sub_calls - self.sub_calls

    def take_sub_calls(self, wanted: int) -> int:
        """Reserve up to ``wanted`` sub-calls; returns how many are allowed."""
        allowed = max(0, min(wanted, self.max_sub_calls - self.sub_calls))
        self.sub_calls += allowed
        return allowed

    def call_started(self) -> None:
        self.in_flight += 1

    def call_ended(self, failed: bool = False) -> None:
        self.in_flight -= 1
        self.failed += failed
        self.done += not failed

    def budget_spent(self) -> str | None:
        """Why the run must stop now (its cost budget has nothing left), or None. A call
        the budget has no room for is refused before it is sent (``llm.budget``); the
        run stops when that is a root turn."""
        limit = self.max_cost_usd
        if limit is None or self.ledger.cost_usd < limit:
            return None
        return f"cost budget spent: ${self.ledger.cost_usd:.4f} of max_cost_usd=${limit:g}"
