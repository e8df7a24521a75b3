"""``RLM.max_session_cost_usd`` is the kernel's budget, whatever the number of ``RLM()``
objects: each RLM's limit is checked against what every RLM of the process spent and
holds (``rlm.session_budget``). An RLM given a ledger outside the kernel's has a budget
of its own.

Priced as in tests/test_budgets.py: the sub-model is ``openai/gpt-4o`` ($2.50 a million
input tokens, $10 output), a call of a ``PROMPT_CHARS`` prompt holds ``MOST`` (~$0.0125)
while it runs and really costs ~$0.003.
"""

from __future__ import annotations

import asyncio

import pytest

from rlm_magic import BudgetExceededError
from rlm_magic.llm.usage import UsageLedger
from rlm_magic.rlm.session_budget import forget_kernel_spend, kernel_ledger

from .support import helpers, make_rlm, run_cell, server_settings

PRICED = "openai/gpt-4o"
MAX_TOKENS = 1000
PROMPT_CHARS = 1000
MOST = (PROMPT_CHARS + 16) * 2.5e-6 + MAX_TOKENS * 1e-5


def prompts(count: int, start: int = 0) -> list[str]:
    return [f"{i:04d} " + "word " * ((PROMPT_CHARS - 5) // 5) for i in range(start, count)]


def room_for(calls: int) -> float:
    """A budget with room for ``calls`` calls at their most, and not one more."""
    return round(MOST * (calls + 0.5), 6)


def priced_rlm(server, **settings):
    server.usage = None  # counted as it would be billed: ~4 characters a token
    return make_rlm(server, sub_model=PRICED, max_tokens=MAX_TOKENS, **settings)


def spent() -> float:
    return kernel_ledger().cost_usd


@pytest.mark.parametrize("rlms", [2, 3])
async def test_rlms_asking_at_once_never_pass_the_budget_they_share(server, rlms):
    budget = room_for(3)
    server.latency = 1.0  # every call in flight when the last is admitted
    askers = [helpers(priced_rlm(server, max_session_cost_usd=budget)) for _ in range(rlms)]
    calls = [ask.llm_query(p) for k, ask in enumerate(askers) for p in prompts(3 * k + 3, 3 * k)]
    outcomes = await asyncio.gather(*calls, return_exceptions=True)
    refused = [o for o in outcomes if isinstance(o, BudgetExceededError)]
    assert len(server.requests) == 3 and len(refused) == 3 * rlms - 3
    assert "RLM.max_session_cost_usd=$" in str(refused[0])
    assert 0 < spent() <= budget


async def test_each_rlm_is_held_to_its_own_limit_against_what_the_kernel_spent(server):
    first = helpers(priced_rlm(server, max_session_cost_usd=room_for(1)))
    await first.llm_query(prompts(1)[0])
    already = spent()
    assert already > 0
    # Room for a call of its own, were its spend its own; not beside the kernel's.
    tight = priced_rlm(server, max_session_cost_usd=MOST + already / 2)
    with pytest.raises(BudgetExceededError, match="RLM.max_session_cost_usd"):
        await helpers(tight).llm_query(prompts(2)[1])
    # A larger limit is its caller's to set: it goes on where the tighter one stopped.
    larger = priced_rlm(server, max_session_cost_usd=already + MOST * 1.2)
    assert (await helpers(larger).llm_query(prompts(3)[2])).startswith("echo: ")
    assert len(server.requests) == 2 and tight.client.ledger.cost_usd == 0


async def test_an_rlm_without_a_limit_is_not_held_and_its_spend_counts_for_the_others(server):
    limited = priced_rlm(server, max_session_cost_usd=MOST * 1.5)
    free = helpers(priced_rlm(server))
    for prompt in prompts(3):
        await free.llm_query(prompt)  # past the other's limit: it has none
    assert spent() > MOST * 0.5
    with pytest.raises(BudgetExceededError):
        await helpers(limited).llm_query("one more")
    assert len(server.requests) == 3


async def test_an_rlm_with_a_ledger_of_its_own_has_a_budget_of_its_own(server):
    await helpers(priced_rlm(server)).llm_query(prompts(1)[0])
    kernel_spent = spent()
    own = priced_rlm(server, ledger=UsageLedger(), max_session_cost_usd=MOST + kernel_spent / 2)
    assert (await helpers(own).llm_query(prompts(2)[1])).startswith("echo: ")
    assert spent() == kernel_spent  # not the kernel's: counted apart
    assert 0 < own.usage().cost_usd <= own.max_session_cost_usd


async def test_forgetting_the_kernels_spend_starts_its_budget_from_zero(server):
    rlm = priced_rlm(server, max_session_cost_usd=room_for(1))
    await helpers(rlm).llm_query(prompts(1)[0])
    rlm.max_session_cost_usd = MOST + spent() / 2
    with pytest.raises(BudgetExceededError):
        await helpers(rlm).llm_query(prompts(2)[1])
    forget_kernel_spend()
    assert spent() == 0
    assert (await helpers(rlm).llm_query(prompts(2)[1])).startswith("echo: ")


async def test_the_notebooks_rlm_and_a_users_share_the_budget_across_a_reload(shell, server):
    from rlm_magic.jupyter.extension import session_rlm

    server.usage = None
    notebook = session_rlm(shell)
    notebook.sub_model, notebook.max_tokens = PRICED, MAX_TOKENS
    await run_cell(shell, f"first = await llm_query({prompts(1)[0]!r})")
    by_notebook = spent()
    assert by_notebook > 0
    user = priced_rlm(server, max_session_cost_usd=MOST + by_notebook / 2)
    with pytest.raises(BudgetExceededError):  # the notebook's spend is the user's too
        await helpers(user).llm_query(prompts(2)[1])
    user.max_session_cost_usd = None
    await helpers(user).llm_query(prompts(2)[1])
    both = spent()
    assert both > by_notebook
    shell.run_line_magic("reload_ext", "rlm_magic")
    reloaded = session_rlm(shell)
    pristine = {name: getattr(reloaded, name) for name in _settings(reloaded)}
    try:
        for name, value in server_settings(server).items():
            setattr(reloaded, name, value)
        reloaded.sub_model, reloaded.max_tokens = PRICED, MAX_TOKENS
        reloaded.max_session_cost_usd = MOST + both / 2  # room beside either's, not both's
        before = len(server.requests)
        with pytest.raises(BudgetExceededError):
            await run_cell(shell, f"await llm_query({prompts(3)[2]!r})")
        assert len(server.requests) == before
    finally:
        for name, value in pristine.items():
            setattr(reloaded, name, value)


def _settings(rlm) -> list[str]:
    return list(rlm.class_trait_names(config=True))
