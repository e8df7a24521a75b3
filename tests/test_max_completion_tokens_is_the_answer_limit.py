"""A caller's ``max_completion_tokens`` (OpenAI's newer name for the answer limit, the
only one its o-series and gpt-5 take; set in ``RLM.litellm_kwargs``) counts as
``max_tokens`` does: a request carries one limit, the smaller, under the caller's name,
and a budget holds, a window fits and a sub-call's cap lowers it as they would
``max_tokens``."""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rlm_magic.llm import budget
from rlm_magic.llm.answer_limit import (
    answer_limit,
    answer_limit_at_most,
    one_answer_limit,
    with_answer_limit,
)
from rlm_magic.llm.usage import UsageLedger

from .support import helpers, make_rlm

limits = st.integers(min_value=1, max_value=1_000_000)
others = st.dictionaries(
    st.sampled_from(["temperature", "seed", "tools", "n", "response_format"]),
    st.one_of(st.integers(0, 5), st.floats(0, 2), st.text(max_size=20)),
    max_size=3,
)


@settings(deadline=None)  # (a loaded machine)
@given(
    max_tokens=st.one_of(st.none(), limits),
    max_completion_tokens=st.one_of(st.none(), limits),
    rest=others,
)
def test_a_request_carries_one_limit_the_smaller_under_the_callers_name(
    max_tokens, max_completion_tokens, rest
):
    params = dict(rest)
    for name, value in (
        ("max_tokens", max_tokens),
        ("max_completion_tokens", max_completion_tokens),
    ):
        if value is not None:
            params[name] = value
    given_limits = [v for v in (max_tokens, max_completion_tokens) if v is not None]
    sent = one_answer_limit(params)
    named = [name for name in ("max_tokens", "max_completion_tokens") if name in sent]
    if not given_limits:
        assert sent == params and answer_limit(sent) is None
        return
    expected = "max_completion_tokens" if max_completion_tokens is not None else "max_tokens"
    assert named == [expected]
    assert sent[expected] == min(given_limits) == answer_limit(params)
    assert answer_limit_at_most(sent) == answer_limit(sent)  # what a server may take
    assert {k: v for k, v in sent.items() if k != expected} == rest


@settings(deadline=None)
@given(limit=limits, lowered=limits)
def test_a_limit_lowered_stays_under_the_name_it_came_by(limit, lowered):
    for name in ("max_tokens", "max_completion_tokens"):
        fitted = with_answer_limit({name: limit, "seed": 1}, min(limit, lowered))
        assert fitted == {name: min(limit, lowered), "seed": 1}


def _held(params: dict, prompt: str) -> tuple[float, int]:
    """What a call sending ``params`` holds in a roomy budget: dollars, answer tokens."""

    async def admitted():
        ledger = UsageLedger()
        ledger.budget = budget.CostBudget(ledger, 1e9, "max_cost_usd")
        messages = [{"role": "user", "content": prompt}]
        hold = await budget.admit(ledger, None, "openai/m", (1e-6, 4e-6), messages, params)
        assert hold is not None
        hold.release()
        return hold.amount, hold.output_tokens

    return asyncio.run(admitted())


@settings(max_examples=100, deadline=None)
@given(tokens=limits, prompt=st.text(max_size=3000), n=st.integers(1, 4))
def test_a_call_is_held_for_max_completion_tokens_as_for_max_tokens(tokens, prompt, n):
    assert _held({"max_completion_tokens": tokens, "n": n}, prompt) == _held(
        {"max_tokens": tokens, "n": n}, prompt
    )


@settings(max_examples=50, deadline=None)
@given(limit=limits, asked=limits, items=st.integers(1, 5))
def test_a_map_holds_each_item_for_the_smaller_limit(limit, asked, items):
    async def holds(options, max_tokens):
        ledger = UsageLedger()
        ledger.budget = budget.CostBudget(ledger, 1e9, "max_cost_usd")
        conversations = [[{"role": "user", "content": f"q{i}"}] for i in range(items)]
        taken, refused = await budget.admit_batch(
            ledger, None, "openai/m", (1e-6, 4e-6), conversations, max_tokens, options
        )
        assert refused is None
        for hold in taken:
            hold.release()
        return [(hold.amount, hold.output_tokens) for hold in taken]

    named = asyncio.run(holds({"max_completion_tokens": limit}, asked))
    assert named == asyncio.run(holds({}, min(limit, asked)))


# -- what the request carries --------------------------------------------------------------


def _limits_sent(request: dict) -> dict:
    return {k: request[k] for k in ("max_tokens", "max_completion_tokens") if k in request}


@pytest.mark.parametrize(
    "run_limit, asked, named, sent",
    [
        (1000, None, 300, 300),  # the caller's limit under its name
        (200, None, 300, 200),  # the run's max_tokens is smaller: it wins, same name
        (1000, 100, 300, 100),  # a sub-call's own, capped at the run's: smaller still
    ],
)
async def test_a_sub_call_sends_one_limit_under_the_callers_name(
    server, run_limit, asked, named, sent
):
    rlm = make_rlm(server, max_tokens=run_limit, litellm_kwargs={"max_completion_tokens": named})
    await helpers(rlm).llm_query("hi", max_tokens=asked)
    assert _limits_sent(server.requests[-1]) == {"max_completion_tokens": sent}


async def test_max_completion_tokens_is_fitted_to_the_window_as_max_tokens_is(server):
    server.reports_window = ("llama.cpp", 4096)  # a local server saying its window
    rlm = make_rlm(server, max_tokens=4000, litellm_kwargs={"max_completion_tokens": 3000})
    await helpers(rlm).llm_query("word " * 2000)  # ~2,500 tokens of prompt
    sent = _limits_sent(server.requests[-1])
    assert list(sent) == ["max_completion_tokens"]
    assert sent["max_completion_tokens"] <= 4096 - 2000
