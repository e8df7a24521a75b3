"""The run tree: what a run shares with its child runs (``rlm_query``): one ledger, one
sub-call budget, one cost budget, and the counts the status panel reads a few times a
second."""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import TYPE_CHECKING

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
    warned_unpriced: bool = False
    iteration: int = 0
    max_iterations: int = 0
    live_turn: LiveTurn | None = None  # the root turn streaming in, for the panel

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

    def over_budget(self) -> bool:
        return self.max_cost_usd is not None and self.ledger.cost_usd > self.max_cost_usd

    def budget_spent(self) -> str | None:
        """Why the run must stop now (its known cost passed ``max_cost_usd``), or None.
        Warns once when the budget cannot see some calls (litellm has no price)."""
        self._warn_if_budget_is_blind()
        if not self.over_budget():
            return None
        return (
            f"cost budget exceeded: spent ${self.ledger.cost_usd:.4f} of "
            f"max_cost_usd=${self.max_cost_usd:g}"
        )

    def _warn_if_budget_is_blind(self) -> None:
        if self.max_cost_usd is None or self.warned_unpriced:
            return
        unpriced = [
            row.model for row in self.ledger.summary().by_model.values() if row.unpriced_calls
        ]
        if unpriced:
            self.warned_unpriced = True
            warnings.warn(
                f"max_cost_usd is set, but litellm has no price for "
                f"{', '.join(unpriced)}: those calls count as $0 against the "
                "budget",
                RuntimeWarning,
                stacklevel=2,
            )
