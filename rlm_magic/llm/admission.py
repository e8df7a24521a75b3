"""A call's admission under cost budgets, as the client asks for it: the most a call (or
a map's items, in order) can cost is held in every budget of its ledger before it is
sent, or it is refused unsent. What is held and how is ``budget``'s; with no budget,
nothing is held and nothing is counted."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from . import budget

if TYPE_CHECKING:
    from ..errors import BudgetExceededError
    from .budget import Reservation
    from .call import Call
    from .endpoints import Endpoint
    from .messages import Messages
    from .usage import UsageLedger


async def admit(call: Call, endpoint: Endpoint) -> None:
    """Hold what ``call`` can cost (keeping what a map already holds for it)."""
    if not budget.budgets_of(call.ledger):
        call.reservation = None  # (no budget: nothing to hold, and no work to find out what)
        return
    call.reservation = await budget.admit(
        call.ledger,
        call.litellm,
        call.model,
        endpoint.highest_rates(call.model, call.litellm),
        call.messages,
        call.params,  # (tools, n... from litellm_kwargs: billed, so held)
        call.reservation,
        endpoint=endpoint.identity,
    )


async def reserve_batch(
    ledger: UsageLedger,
    litellm: Any,
    endpoint: Endpoint,
    conversations: list[Messages],
    model: str,
    max_tokens: int,
    litellm_kwargs: dict[str, Any],
) -> tuple[list[Reservation | None], BudgetExceededError | None]:
    """Holds for a map's items (see ``LLMClient.reserve_batch``)."""
    return await budget.admit_batch(
        ledger,
        litellm,
        model,
        endpoint.highest_rates(model, litellm),
        conversations,
        max_tokens,
        litellm_kwargs,
        endpoint=endpoint.identity,
    )
