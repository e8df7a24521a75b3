"""The first calls of a model priced only by what its server reports (a LiteLLM Proxy's
``x-litellm-response-cost``; litellm's price map has no entry) are held to the budget
too: until a cost is reported, a call is held at the highest rates litellm prices any
model at, or all that is left; the first goes alone, the rest wait for its cost unless
their guess fits beside it, and a call of any model that does not fit beside a guess
waits for it to land rather than be refused. Against the local server playing the
proxy: bursts of first calls, alone and beside a priced model's map."""

from __future__ import annotations

import asyncio

import pytest

from rlm_magic import BatchError, BudgetExceededError

from .support import helpers, make_rlm

PROXY_PRICED = "openai/team-gpt"  # litellm has no price for it; the "proxy" reports one
PRICED = "openai/gpt-4o"  # $2.50 / $10 a million tokens
pytestmark = pytest.mark.filterwarnings("ignore:RLM.max_session_cost_usd is set")


def spent(rlm) -> float:
    return rlm.usage().total.cost_usd or 0.0


def proxy_reports(server, monkeypatch, dollars: str) -> None:
    """Each answer for PROXY_PRICED says it cost ``dollars``, as a LiteLLM Proxy does."""
    monkeypatch.setattr(
        server,
        "response_headers",
        lambda body: (
            {"x-litellm-response-cost": dollars} if body.get("model") == "team-gpt" else None
        ),
    )


def proxy_prices_by_the_token(server, monkeypatch, per_input: float, per_output: float) -> None:
    """Each answer for PROXY_PRICED says what its tokens cost (the echo it answers, as
    the server counts them): a proxy pricing its upstream by the token."""
    server.usage = None  # ~4 characters a token

    def cost(body):
        if body.get("model") != "team-gpt":
            return None
        prompt, output = server.usage_for(body, "echo: " + body["messages"][-1]["content"])
        return {"x-litellm-response-cost": repr(prompt * per_input + output * per_output)}

    monkeypatch.setattr(server, "response_headers", cost)


async def asked_at_once(rlm, count: int) -> list[object]:
    """``count`` single calls at once (not a map: each is admitted on its own)."""
    ask = helpers(rlm).llm_query
    return await asyncio.gather(
        *(ask(f"question {i}", model=PROXY_PRICED) for i in range(count)),
        return_exceptions=True,
    )


@pytest.mark.parametrize("budget, sent", [(0.002, 1), (0.01, 1), (0.1, 2)])
async def test_a_burst_of_first_calls_never_spends_past_the_budget(
    server, monkeypatch, budget, sent
):
    # A dear model ($100 / $400 a million): ~$0.0018 a call. The first is held at the
    # guess ($0.063) or all that is left, the rest wait for its cost; then they are held
    # at the rates it bounds (~$0.062 a call: a short exchange bounds them loosely), so
    # under $0.10 one more fits beside nothing else, and the others are refused unsent.
    proxy_prices_by_the_token(server, monkeypatch, 1e-4, 4e-4)
    server.latency = 0.2  # all in flight together, if they were let go
    rlm = make_rlm(server, max_tokens=100, max_session_cost_usd=budget, max_concurrency=32)
    answers = await asked_at_once(rlm, 20)
    went = [a for a in answers if isinstance(a, str)]
    print(f"budget {budget}: {len(went)} of 20 went, spent {spent(rlm):.4f}")
    assert spent(rlm) <= budget + 1e-12
    assert len(went) == sent
    assert all(isinstance(a, BudgetExceededError) for a in answers if not isinstance(a, str))


async def test_a_priced_map_beside_a_first_call_waits_for_it_rather_than_overspend(
    server, monkeypatch
):
    # Unheld, the first call ($0.02) left the map room for 4 calls of $0.01: $0.06 of
    # $0.05. Held at all that is left, the map waits for its cost, then takes 2.
    proxy_reports(server, monkeypatch, "0.02")
    server.usage = (10, 1000)  # each priced call costs what it holds (~$0.01)
    server.model_latency["team-gpt"] = 0.5
    rlm = make_rlm(server, max_tokens=1000, max_session_cost_usd=0.05)
    first = asyncio.ensure_future(helpers(rlm).llm_query("one", model=PROXY_PRICED))
    while not server.requests:  # the proxy-priced call is in flight
        await asyncio.sleep(0.01)
    with pytest.raises(BatchError) as refused:
        await helpers(rlm).llm_query_batch([f"q{i}" for i in range(8)], model=PRICED)
    await first
    print(f"priced map beside a first call: spent {spent(rlm):.4f} of 0.05")
    assert spent(rlm) <= 0.05 + 1e-9
    assert len(server.requests_for("gpt-4o")) == 2  # it waited, and was not refused whole
    assert sum(r is not None for r in refused.value.results) == 2


async def test_first_calls_whose_guess_fits_go_together(server, monkeypatch):
    # Room for every call at the highest rates any model is priced at: none waits.
    proxy_reports(server, monkeypatch, "0.01")
    server.latency = 1.0  # (long enough for all to be admitted while the first runs)
    rlm = make_rlm(server, max_tokens=1000, max_session_cost_usd=100.0, max_concurrency=16)
    answers = await asked_at_once(rlm, 8)
    assert all(isinstance(a, str) for a in answers)
    assert server.peak_in_flight == 8


async def test_first_calls_whose_guess_does_not_fit_go_one_then_the_rest_together(
    server, monkeypatch
):
    # $0.0001 a call; the first's guess ($0.063) leaves no room for a second's beside
    # it; its cost bounds the rates the rest are held at ($0.0022 each): they go at once.
    proxy_reports(server, monkeypatch, "0.0001")
    server.latency = 1.0
    rlm = make_rlm(server, max_tokens=100, max_session_cost_usd=0.1, max_concurrency=16)
    answers = await asked_at_once(rlm, 8)
    assert all(isinstance(a, str) for a in answers)
    assert server.peak_in_flight == 7
    assert spent(rlm) == pytest.approx(0.0008)
