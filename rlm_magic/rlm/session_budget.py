"""One session budget per kernel, whatever the number of ``RLM()`` objects.

``RLM.max_session_cost_usd`` limits what the kernel (this process) spends, not what one
``RLM`` does. Every RLM's ledger is a child of the kernel's (``kernel_ledger()``), and
each RLM's session budget (a ``SessionBudget`` on its own ledger) counts as spent what
the kernel's ledger recorded, whichever RLM or helper made the call, and as held what
every session budget of the kernel holds for its calls in flight.

The limit is the calling RLM's ``max_session_cost_usd``, read at each call (a
``%config`` holds from the next): two RLMs set to $1 spend $1 between them; one set to
$2 may go on where one set to $1 is refused; an RLM set to None is not held, and what it
spends still counts against the others.

An RLM given a ledger outside the kernel's (``RLM(ledger=UsageLedger())``, as an
application that hosts several users in one process may do) has a budget of its own,
counting that ledger only. The kernel's ledger lives in this module, so a ``%reload_ext
rlm_magic`` (which reloads the package, not its modules) goes on counting from what was
spent; ``forget_kernel_spend()`` starts it from $0 again (a test's fresh kernel).
"""

from __future__ import annotations

import weakref
from collections.abc import Callable

from ..llm.budget import CostBudget
from ..llm.usage import SESSION_LEDGER, UsageLedger

SETTING = "RLM.max_session_cost_usd"

# Every RLM's calls in this process (below it, each RLM's ledger; above it, the usage()
# of every call, which `%rlm usage --reset` clears without touching the budget).
_KERNEL = UsageLedger(SESSION_LEDGER)
# The session budgets counted against it: their holds are the kernel's calls in flight.
_BUDGETS: weakref.WeakSet[SessionBudget] = weakref.WeakSet()

Limit = Callable[[], float | None]


def kernel_ledger() -> UsageLedger:
    """The ledger of every ``RLM``'s calls in this process."""
    return _KERNEL


def forget_kernel_spend() -> None:
    """Start the kernel's session budget from $0, as in a new kernel (the calls in
    flight keep what they hold)."""
    _KERNEL.clear()


class SessionBudget(CostBudget):
    """``RLM.max_session_cost_usd`` on one RLM's ledger, counted against the kernel:
    what is left is the limit, less what the kernel spent, less what every session
    budget of the kernel holds."""

    def __init__(self, ledger: UsageLedger, limit: Limit):
        super().__init__(ledger, limit, SETTING)
        _BUDGETS.add(self)

    def left(self) -> float:
        limit = self.limit
        if limit is None:
            return float("inf")
        held = sum(budget.held for budget in list(_BUDGETS))
        return limit - _KERNEL.cost_usd - held


def hold_session_budget(ledger: UsageLedger, limit: Limit) -> CostBudget:
    """Put the session budget on ``ledger`` (an RLM's), limited by ``limit()``. A ledger
    that has one already (a reloaded extension's RLM takes the notebook's ledger) keeps
    it, with what its calls in flight hold; only its limit is read anew."""
    kept = ledger.budget
    if isinstance(kept, CostBudget) and kept.setting == SETTING:
        kept.limit_by(limit)
        return kept
    budget: CostBudget
    if _under_kernel(ledger):
        budget = SessionBudget(ledger, limit)
    else:
        budget = CostBudget(ledger, limit, SETTING)
    ledger.budget = budget
    return budget


def _under_kernel(ledger: UsageLedger | None) -> bool:
    while ledger is not None:
        if ledger is _KERNEL:
            return True
        ledger = ledger.parent
    return False
