"""Cost budgets that are never exceeded (``max_cost_usd``, ``RLM.max_session_cost_usd``):
a call goes only if the most it can cost fits in what is left, counting the calls in
flight at their most; a batch is cut to what fits before anything is sent.

The sub-model here is ``openai/gpt-4o`` ($2.50 a million input tokens, $10 output),
served by the local server, which counts a prompt at ~4 characters a token. A prompt of
``PROMPT_CHARS`` characters is held at its bytes plus a little (it is that short), and
``MAX_TOKENS`` of answer at $10 a million: each call holds ``MOST`` (~$0.0125) while it
runs and really costs ~$0.003.
"""

from __future__ import annotations

import asyncio
import warnings

import pytest

from rlm_magic import BatchError, BudgetExceededError, ConfigError

from .support import helpers, make_rlm, repl
from .support.priced import MAX_TOKENS, PRICED, priced_rlm, prompts, room_for


@pytest.mark.filterwarnings("ignore:max_cost_usd is set")  # the root model is unpriced
async def test_a_batch_is_cut_to_what_the_budget_holds_before_anything_is_sent(server):
    # The case scaled down: 64 prompts, a budget with room for 10 at their most.
    budget = room_for(10)
    rlm = priced_rlm(server, max_cost_usd=budget, sandbox="none")
    server.latency = 0.2  # all ten in flight at once: none has given its hold back
    server.script("root-model", [repl("answers = llm_query_batch(context)"), "FINAL(done)"])
    result = await rlm.arun("q", context=prompts(64))
    answers = result.variables["answers"]
    assert len(server.requests_for("gpt-4o")) == 10
    assert all(a.startswith("echo: ") for a in answers[:10])
    refusal = answers[10]
    assert answers[10:] == [refusal] * 54
    assert refusal.startswith("Error: not sent to 'openai/gpt-4o': it could cost up to $0.0125")
    assert f"max_cost_usd=${budget:g} has $" in refusal
    assert refusal.endswith("54 of this batch's 64 items were not sent")
    assert result.usage.cost_usd <= budget


async def test_calls_in_flight_count_at_their_most(server):
    budget = room_for(3)
    rlm = priced_rlm(server, max_session_cost_usd=budget)
    server.latency = 1.5  # eight calls at once: none has ended when the last is admitted
    ask = helpers(rlm).llm_query
    outcomes = await asyncio.gather(*(ask(p) for p in prompts(8)), return_exceptions=True)
    refused = [o for o in outcomes if isinstance(o, BudgetExceededError)]
    assert len(refused) == 5 and len(server.requests) == 3
    assert "RLM.max_session_cost_usd=$" in str(refused[0])
    assert rlm.usage().cost_usd <= budget


async def test_what_a_call_did_not_spend_lets_later_calls_in(server):
    # Room for one call at its most; each really costs a quarter of that.
    budget = room_for(1)
    rlm = priced_rlm(server, max_session_cost_usd=budget)
    server.latency = 1.0
    ask = helpers(rlm).llm_query
    first, second, third = prompts(3)
    running = asyncio.ensure_future(ask(first))
    await asyncio.to_thread(server.wait_for, lambda: len(server.requests) == 1, 10)
    with pytest.raises(BudgetExceededError):
        await ask(second)  # the first holds its most while it runs
    assert (await running).startswith("echo: ")
    assert (await ask(third)).startswith("echo: ")  # what it did not spend came back
    assert len(server.requests) == 2
    assert rlm.usage().cost_usd <= budget


async def test_a_call_the_budget_cannot_hold_is_refused_in_one_line_and_not_sent(server):
    rlm = priced_rlm(server, max_session_cost_usd=0.01)
    with pytest.raises(BudgetExceededError) as refused:
        await helpers(rlm).llm_query(prompts(1)[0])
    assert str(refused.value) == (
        "not sent to 'openai/gpt-4o': it could cost up to $0.0125 "
        "(~1,008 input tokens and max_tokens=1,000), and "
        "RLM.max_session_cost_usd=$0.01 has $0.0100 left"
    )
    assert server.requests == []


async def test_a_model_without_a_price_is_said_once_before_anything_is_sent(server):
    rlm = make_rlm(server, max_session_cost_usd=1.0)  # sub-model has no price
    sent_when_warned = []
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.showwarning = lambda message, *_: sent_when_warned.append(
            (str(message), len(server.requests))
        )
        await helpers(rlm).llm_query("one")
        await helpers(rlm).llm_query_batch(["two", "three"])
    assert sent_when_warned == [
        (
            "RLM.max_session_cost_usd is set, but litellm has no price for openai/sub-model: "
            "until a cost it reports says what it charges, its calls are held at the highest "
            "rates litellm prices any model at (one at a time when that does not fit), then "
            "at the rates its reported costs imply; if it reports none, they are sent while "
            "the budget has anything left, and counted as $0",
            0,
        )
    ]
    assert len(server.requests) == 3


async def test_max_session_cost_usd_holds_notebook_maps_and_says_what_was_not_sent(server):
    budget = room_for(10)
    rlm = priced_rlm(server, max_session_cost_usd=budget)
    server.latency = 0.2
    with pytest.raises(BatchError) as failed:
        await helpers(rlm).llm_query_batch(prompts(64))
    assert len(server.requests) == 10
    results, errors = failed.value.results, failed.value.errors
    assert all(r.startswith("echo: ") for r in results[:10]) and results[10:] == [None] * 54
    assert sorted(errors) == list(range(10, 64))
    assert all(isinstance(e, BudgetExceededError) for e in errors.values())
    assert "54 of this batch's 64 items were not sent" in str(failed.value)
    assert rlm.usage().cost_usd <= budget


def test_max_session_cost_usd_is_checked_like_max_cost_usd(server):
    from traitlets import TraitError

    rlm = make_rlm(server)
    for wrong in (-1.0, float("nan")):
        with pytest.raises(TraitError, match="max_session_cost_usd must be >= 0 or None"):
            rlm.max_session_cost_usd = wrong
    rlm.max_session_cost_usd = None


async def test_a_resumed_map_holds_nothing_for_the_answers_kept_on_disk(server, tmp_path):
    items = prompts(6)
    server.fail("500", times=99, match="0004")
    server.fail("500", times=99, match="0005")
    rlm = priced_rlm(server, cache_dir=str(tmp_path), max_retries=0)
    with pytest.raises(BatchError):
        await helpers(rlm).llm_query_batch(items, resume=True)
    server.reset()
    # A new RLM with room for one call beside what the first spent (the session budget is
    # the kernel's): the four kept answers hold nothing, so one of the two missing
    # prompts is sent.
    first_spent = rlm.usage().cost_usd or 0.0
    again = priced_rlm(
        server, cache_dir=str(tmp_path), max_session_cost_usd=first_spent + room_for(1)
    )
    with pytest.raises(BatchError) as failed:
        await helpers(again).llm_query_batch(items, resume=True)
    assert failed.value.results == [f"echo: {p}" for p in items[:5]] + [None]
    assert list(failed.value.errors) == [5]
    assert len(server.requests) == 1


@pytest.mark.filterwarnings("ignore:max_cost_usd is set")  # the root model is unpriced
async def test_child_runs_share_their_parents_budget(server):
    # Each child's root turn (the sub-model, gpt-4o) holds its system prompt (500 to
    # 2,200 tokens, as counted) and 4,000 tokens of answer: $0.041 to $0.046. Room for
    # two of the three at once.
    budget = 0.1
    server.usage = None
    rlm = make_rlm(server, sub_model=PRICED, max_tokens=4000, max_cost_usd=budget, sandbox="none")
    server.model_latency["gpt-4o"] = 1.5  # the three children overlap
    server.reply_with("gpt-4o", "FINAL(child answer)")
    server.script(
        "root-model",
        [repl("answers = rlm_query_batch(['a', 'b', 'c'])"), "FINAL(done)"],
    )
    result = await rlm.arun("q", context="c")
    answers = result.variables["answers"]
    assert sorted(answers)[-2:] == ["child answer", "child answer"]
    refused = sorted(answers)[0]
    assert refused.startswith("Error: child RLM failed: stopped by the cost budget: not sent")
    assert f"max_cost_usd=${budget:g}" in refused
    assert len(server.requests_for("gpt-4o")) == 2
    assert result.usage.cost_usd <= budget


async def test_a_root_turn_the_budget_cannot_hold_stops_the_run_with_its_partial_result(
    server,
):
    # A question of ~2,000 tokens: the first turn holds ~$0.0165 and costs ~$0.0062;
    # the second would hold ~$0.0166, and $0.0128 is left.
    budget = 0.019
    rlm = make_rlm(server, model=PRICED, max_tokens=MAX_TOKENS, max_cost_usd=budget)
    server.usage = None
    server.script("gpt-4o", [repl("x = 1"), "FINAL(too late)"])
    result = await rlm.arun("How many words? " + "word " * 1600, context="c")
    assert not result.success and result.stop_reason == "budget"
    assert result.error.startswith("stopped by the cost budget: not sent to 'openai/gpt-4o'")
    assert result.iterations == 1 and 0 < result.usage.cost_usd <= budget
    assert len(server.requests_for("gpt-4o")) == 1


async def test_a_streamed_answer_past_what_its_budget_holds_is_cut_and_marked(server):
    # A server that ignores max_tokens: asked for 100 tokens, it streams ~5,000.
    rlm = priced_rlm(server, max_session_cost_usd=0.0025)
    server.reply_with("gpt-4o", "word " * 4000)
    server.token_delay = 0.001  # still streaming when it is cut
    answer = await helpers(rlm).llm_query("short", max_tokens=100)
    assert answer.startswith("word word")
    assert "[answer cut off: cut at ~" in answer and "has no room for more" in answer
    assert len(answer) < 2000
    assert rlm.usage().cost_usd <= 0.0025


@pytest.fixture
def first_call_under_a_budget():
    """As in a fresh kernel: no model's tokenizer loaded yet for counting answers."""
    from rlm_magic.llm import profiles

    profiles.forget()


async def test_an_answer_within_max_tokens_is_never_cut_however_tight_the_budget(
    server, first_call_under_a_budget
):
    # Room for this one call at its most, and nothing more: ~88 tokens of a 100 asked
    # (350 characters: the server counts 4 a token, the tokenizer 70).
    rlm = priced_rlm(server, max_session_cost_usd=0.0011)
    server.reply_with("gpt-4o", "word " * 70)
    server.token_delay = 0.001
    answer = await helpers(rlm).llm_query("short", max_tokens=100)
    assert answer == "word " * 70 and rlm.usage().cost_usd <= 0.0011


async def test_an_answer_dense_in_tokens_is_cut_within_its_budget_too(
    server, first_call_under_a_budget
):
    # Digits are a token each: counted as characters at ~4 a token, they ran 4x over
    # (the first call of a session did, while the tokenizer loaded).
    rlm = priced_rlm(server, max_session_cost_usd=0.0025)
    server.reply_with("gpt-4o", " ".join(str(i % 10) for i in range(4000)))
    server.token_delay = 0.001
    answer = await helpers(rlm).llm_query("short", max_tokens=100)
    assert "[answer cut off: cut at ~" in answer
    assert rlm.usage().cost_usd <= 0.0025


async def test_a_batch_job_is_refused_under_a_cost_budget(server):
    # Its cost is known only when it ends: it could not be held to the budget.
    rlm = priced_rlm(server, max_session_cost_usd=1.0)
    with pytest.raises(ConfigError, match=r"cannot be held to a cost budget \(RLM.max_sess"):
        await helpers(rlm).llm_query_batch(["a", "b"], batch_job=True)
    assert server.requests == [] and not server.batch_jobs.batches


async def test_a_map_interrupted_while_it_takes_its_holds_gives_them_back(server):
    rlm = priced_rlm(server, max_session_cost_usd=100.0)
    budget = rlm.client.ledger.budget
    # Long prompts are counted in a thread: the map is still taking holds when stopped.
    long = [f"{i} " + "lorem ipsum dolor sit amet " * 3000 for i in range(100)]
    mapping = asyncio.ensure_future(helpers(rlm).llm_query_batch(long))
    while budget.held == 0:
        await asyncio.sleep(0.001)
    mapping.cancel()
    with pytest.raises(asyncio.CancelledError):
        await mapping
    assert server.requests == [] and budget.held == pytest.approx(0.0, abs=1e-12)


async def test_a_model_without_a_price_is_held_at_the_rates_its_reported_costs_imply(
    server, monkeypatch
):
    # A LiteLLM Proxy prices what litellm cannot, and says so in a header: $0.01 for
    # 1,000 + 200 tokens bounds its rates at $1e-5 a token in, $5e-5 out (200 out, or
    # 20x the input rate); "two" holds ~$0.0051 of the $0.01 left, "three" has none.
    monkeypatch.setattr(
        server, "response_headers", lambda body: {"x-litellm-response-cost": "0.01"}
    )
    server.usage = (1000, 200)
    rlm = make_rlm(server, sub_model="openai/team-gpt", max_tokens=100, max_session_cost_usd=0.02)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for question in ("one", "two"):
            await helpers(rlm).llm_query(question)
        with pytest.raises(BudgetExceededError, match="at the rates its reported costs imply"):
            await helpers(rlm).llm_query("three")
    assert len(server.requests) == 2 and rlm.usage().cost_usd == pytest.approx(0.02)


async def test_a_map_holds_n_answers_a_call_before_anything_is_sent(server):
    # n=2 in litellm_kwargs: each call holds two answers of max_tokens (~$0.0225), so
    # room for 4 single answers has room for 2 calls.
    rlm = priced_rlm(server, max_session_cost_usd=room_for(4), litellm_kwargs={"n": 2})
    server.latency = 0.2
    with pytest.raises(BatchError) as failed:
        await helpers(rlm).llm_query_batch(prompts(8))
    assert len(server.requests) == 2
    assert "2 answers of max_tokens=1,000" in str(failed.value.errors[7])


@pytest.mark.filterwarnings("ignore:RLM.max_session_cost_usd is set")
async def test_a_model_whose_costs_are_not_reported_goes_one_at_a_time_only_once(
    server, monkeypatch
):
    # No price and no reported cost: nothing to learn, so after the first call the rest
    # go at once, as without a budget (one at a time would take 4 x 0.3 s).
    rlm = make_rlm(server, max_session_cost_usd=1.0)
    server.latency = 0.3
    started = asyncio.get_running_loop().time()
    await helpers(rlm).llm_query_batch(["a", "b", "c", "d"])
    assert len(server.requests) == 4
    assert asyncio.get_running_loop().time() - started < 1.0


async def test_a_typed_answers_schema_is_held_as_input(server):
    rlm = priced_rlm(server, max_session_cost_usd=room_for(1))
    schema = {
        "type": "object",
        "properties": {f"field_{i}": {"type": "string"} for i in range(1500)},
    }  # ~50,000 characters, billed as input with the question
    with pytest.raises(BudgetExceededError, match="could cost up to"):
        await helpers(rlm).llm_query("hi", response_format=schema)
    assert server.requests == []


async def test_reloading_the_extension_does_not_start_the_session_budget_again(shell, server):
    from rlm_magic.jupyter.extension import session_rlm

    from .support import run_cell, server_settings

    server.usage = None
    rlm = session_rlm(shell)
    rlm.sub_model, rlm.max_tokens, rlm.max_session_cost_usd = PRICED, 100, 0.002
    await run_cell(shell, "answer = await llm_query('spend a little')")
    spent = rlm.usage().cost_usd
    assert spent > 0
    shell.run_line_magic("reload_ext", "rlm_magic")
    reloaded = session_rlm(shell)
    pristine = {name: getattr(reloaded, name) for name in reloaded.class_trait_names(config=True)}
    try:
        assert reloaded is not rlm  # a new RLM, with the settings of the shell's config
        for name, value in server_settings(server).items():
            setattr(reloaded, name, value)
        reloaded.sub_model, reloaded.max_tokens = PRICED, 100
        reloaded.max_session_cost_usd = spent + 0.0005  # room for what was spent, and a call
        before = len(server.requests)
        with pytest.raises(BudgetExceededError):  # $0.0011 at its most: no room left
            await run_cell(shell, "await llm_query('one more')")
        assert len(server.requests) == before  # refused, not sent
        assert reloaded.usage().cost_usd == pytest.approx(spent)
    finally:
        for name, value in pristine.items():
            setattr(reloaded, name, value)
