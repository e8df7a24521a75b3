"""What a model's reported costs taught about its price lives in ``llm/profiles``, per
endpoint, and ``profiles.forget()`` forgets it with everything else learned: after a
proxy was restarted with other prices, or between tests, nothing taught before prices a
call after. Its tokenizer's loading, for counting answers under a budget, too."""

from __future__ import annotations

import pytest

from rlm_magic.llm import budget, profiles
from rlm_magic.llm.usage import CallRecord, UsageLedger

from .support import helpers, make_rlm

PROXY_PRICED = "openai/team-gpt"  # a name litellm has no price for
pytestmark = pytest.mark.filterwarnings("ignore:(RLM.max_session_cost_usd|max_cost_usd) is set")


def budgeted(dollars: float) -> UsageLedger:
    ledger = UsageLedger()
    ledger.budget = budget.CostBudget(ledger, dollars, "max_cost_usd")
    return ledger


ONE = [{"role": "user", "content": "one"}]


async def test_a_price_learned_from_reported_costs_is_forgotten_by_forget(server, monkeypatch):
    # The local server reports each call's cost as a LiteLLM Proxy does.
    monkeypatch.setattr(
        server, "response_headers", lambda body: {"x-litellm-response-cost": "0.01"}
    )
    server.usage = (1000, 200)
    rlm = make_rlm(server, sub_model=PROXY_PRICED, max_session_cost_usd=1.0)
    await helpers(rlm).llm_query("one")
    learned = [p.reported_price for p in profiles.PROFILES.endpoints.values()]
    assert [price.rates for price in learned if price.rates] == [(1e-5, 5e-5)]
    assert profiles.PROFILES.model(PROXY_PRICED).tokenizer_loading is not None

    profiles.forget()

    assert not profiles.PROFILES.endpoints and not profiles.PROFILES.models
    assert profiles.PROFILES.reported_price(None, PROXY_PRICED).rates is None


async def test_after_forget_a_call_is_held_at_a_guess_again_not_at_what_was_learned():
    learned = profiles.Profiles()
    ledger = budgeted(100.0)
    hold = await budget.admit(
        ledger, None, PROXY_PRICED, None, ONE, {"max_tokens": 100}, learned=learned
    )
    assert hold is not None
    hold.landed(CallRecord(PROXY_PRICED, input_tokens=1000, output_tokens=200, cost_usd=0.01))
    hold.release()
    at_learned = await budget.admit(
        ledger, None, PROXY_PRICED, None, ONE, {"max_tokens": 100}, learned=learned
    )
    assert at_learned is not None and at_learned.guess is None
    at_learned.release()

    learned.forget()

    guessed = await budget.admit(
        ledger, None, PROXY_PRICED, None, ONE, {"max_tokens": 100}, learned=learned
    )
    assert guessed is not None and guessed.guess is not None
    assert guessed.amount > at_learned.amount * 10  # the ceiling's rates, not the learned
    guessed.release()


async def test_a_price_reported_at_one_endpoint_does_not_price_the_name_at_another():
    learned = profiles.Profiles()
    ledger = budgeted(100.0)
    hold = await budget.admit(
        ledger, None, PROXY_PRICED, None, ONE, {"max_tokens": 100},
        endpoint="http://proxy-a/v1", learned=learned,
    )  # fmt: skip
    assert hold is not None
    hold.landed(CallRecord(PROXY_PRICED, input_tokens=1000, output_tokens=200, cost_usd=0.01))
    hold.release()
    assert learned.reported_price("http://proxy-a/v1", PROXY_PRICED).rates is not None
    assert learned.reported_price("http://proxy-b/v1", PROXY_PRICED).rates is None
    elsewhere = await budget.admit(
        ledger, None, PROXY_PRICED, None, ONE, {"max_tokens": 100},
        endpoint="http://proxy-b/v1", learned=learned,
    )  # fmt: skip
    assert elsewhere is not None and elsewhere.guess is not None  # not priced there
    elsewhere.release()
