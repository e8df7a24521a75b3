"""The evaluation harness (rlm_magic.eval): generated tasks, scorers, the methods run
through one RLM against the local server, the plan, the table and the magic."""

from __future__ import annotations

import asyncio
import json
import re

import pytest

from rlm_magic.eval import Evaluation, custom_task, evaluate, scorers, tasks, wilson
from rlm_magic.eval.methods import COMBINE_PROMPT, chunk_lines
from rlm_magic.eval.plan import EvalPlan
from rlm_magic.eval.results import EvalResults

from .support import make_rlm, run_cell

PRICED = "openai/gpt-4o"  # litellm knows its price: costs are numbers, not "?"


def priced_rlm(server, **settings):
    return make_rlm(server, model=PRICED, sub_model=PRICED, sandbox="none", **settings)


def question_of(body: dict) -> str:
    return body["messages"][-1]["content"].split("\n\n", 1)[0]


# -- tasks ------------------------------------------------------------------------------
@pytest.mark.parametrize("name", sorted(tasks.BUILT_IN))
def test_a_task_makes_the_same_items_from_the_same_seed(name):
    task = tasks.BUILT_IN[name]
    first, again = task.items(4000, 3, seed=7), task.items(4000, 3, seed=7)
    assert [(i.context, i.question, i.expected) for i in first] == [
        (i.context, i.question, i.expected) for i in again
    ]
    other = task.items(4000, 3, seed=8)
    assert [i.context for i in first] != [i.context for i in other]
    assert len({i.context for i in first}) == 3  # items of one run differ too


@pytest.mark.parametrize("name", sorted(tasks.BUILT_IN))
@pytest.mark.parametrize("size", [2_000, 64_000])
def test_a_task_item_is_the_size_asked_in_estimated_tokens(name, size):
    item = tasks.BUILT_IN[name].make(size, 0, 0)
    assert size <= item.tokens <= size * 1.02 + 50
    assert item.question and item.expected is not None
    assert tasks.BUILT_IN[name].source


def test_the_needle_is_where_the_item_says_and_nowhere_else():
    for index in range(5):
        item = tasks.BUILT_IN["niah"].make(16_000, index, 0)
        needle = item.facts["needle"]
        assert item.context[item.facts["offset"] :].startswith(needle)
        assert item.context.count(item.expected) == 1
        assert abs(item.facts["offset"] / len(item.context) - item.facts["depth"]) < 0.01


def test_the_two_hop_facts_sit_far_apart():
    for index in range(5):
        item = tasks.BUILT_IN["two_hop"].make(32_000, index, 0)
        (works, sits), (first, second) = item.facts["facts"], item.facts["offsets"]
        assert item.context[first:].startswith(works)
        assert item.context[second:].startswith(sits)
        assert first < 0.3 * len(item.context) < 0.7 * len(item.context) < second
        assert sits.endswith(f"in {item.expected}.")
        assert item.context.count(works) == 1


def test_aggregation_answers_are_the_contexts_own_counts():
    count = tasks.BUILT_IN["count"].make(8_000, 0, 0)
    topic = count.facts["topic"]
    assert count.context.count(f"| topic: {topic} |") == count.expected
    common = tasks.BUILT_IN["most_common"].make(8_000, 0, 0)
    tally = common.facts["tally"]
    assert max(tally, key=tally.get) == common.expected
    assert sorted(tally.values())[-1] > sorted(tally.values())[-2]
    pairs = tasks.BUILT_IN["pairs"].make(8_000, 0, 0)
    users = pairs.facts["users"]
    assert len(pairs.expected) == len(users) * (len(users) - 1) // 2
    for user in users:
        assert f"user {user} | topic: astronomy |" in pairs.context


def test_sizes_read_as_tokens():
    assert [tasks.parse_size(s) for s in ("8k", "64K", "1M", "1.5k", 3000)] == [
        8_000,
        64_000,
        1_000_000,
        1_500,
        3_000,
    ]
    with pytest.raises(Exception, match="8k"):
        tasks.parse_size("eight")


# -- scorers ----------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("answer", "expected", "score"),
    [
        ("Lisbon", "Lisbon", 1),
        ("  **lisbon.** ", "Lisbon", 1),
        ('"Lisbon"', "Lisbon", 1),
        ("I think the city is\nLisbon", "Lisbon", 1),
        ("The answer is: Lisbon", "Lisbon", 1),
        ("Porto", "Lisbon", 0),
        ("Lisbon or Porto", "Lisbon", 0),
        ("", "Lisbon", 0),
    ],
)
def test_exact(answer, expected, score):
    assert scorers.exact(answer, expected) == score


@pytest.mark.parametrize(
    ("answer", "expected", "tolerance", "score"),
    [
        ("42", 42, {}, 1),
        ("There are 42 records.", 42, {}, 1),
        ("1,204", 1204, {}, 1),
        ("41", 42, {}, 0),
        ("41", 42, {"abs_tol": 1}, 1),
        ("95", 100, {"rel_tol": 0.05}, 1),
        ("94", 100, {"rel_tol": 0.05}, 0),
        ("none", 42, {}, 0),
    ],
)
def test_numeric(answer, expected, tolerance, score):
    assert scorers.numeric(**tolerance)(answer, expected) == score


def test_a_count_scores_as_oolong_does():
    assert scorers.oolong_numeric("40", 40) == 1
    assert scorers.oolong_numeric("I count 42.", 40) == pytest.approx(0.75**2)
    assert scorers.oolong_numeric("many", 40) == 0


def test_set_overlap_is_the_f1_of_the_items():
    score = scorers.set_overlap(scorers.dash_pairs)
    want = {"1-2", "1-3", "2-3", "3-4"}
    assert score("1-2, 3-1, 2-3, 3-4", want) == 1  # order within a pair does not count
    assert score("1-2, 2-3", want) == pytest.approx(2 * 1.0 * 0.5 / 1.5)  # P 1, R 1/2
    assert score("1-2, 2-3, 5-6, 7-8", want) == pytest.approx(0.5)  # P 1/2, R 1/2
    assert score("none", want) == 0
    assert scorers.set_overlap()("apples, Pears", ["pears", "apples"]) == 1


def test_wilson_interval():
    assert wilson(0, 10) == pytest.approx((0.0, 0.2775), abs=1e-4)
    assert wilson(10, 10) == pytest.approx((0.7225, 1.0), abs=1e-4)
    low, high = wilson(5, 10)
    assert low == pytest.approx(0.2366, abs=1e-4) and high == pytest.approx(0.7634, abs=1e-4)


def test_chunks_are_whole_lines_of_about_the_size_asked():
    text = "\n".join(f"line {i:04d}" for i in range(1000))
    chunks = chunk_lines(text, 1000)
    assert "\n".join(chunks) == text
    assert all(len(c) <= 1000 for c in chunks) and len(chunks) == 10  # 100 lines each


# -- running ----------------------------------------------------------------------------
async def test_a_model_right_on_some_items_gets_exactly_that_accuracy(server):
    items = tasks.BUILT_IN["niah"].items(2_000, 6, seed=3)
    right = {i.question: i.expected for i in items[:4]}  # right on 4 of 6
    server.reply_with("gpt-4o", lambda body: right.get(question_of(body), "1234567"))
    rlm = priced_rlm(server)
    results = await evaluate(rlm, "niah", ["2k"], n=6, methods="direct", seed=3)
    assert [i.score for i in results.items] == [1, 1, 1, 1, 0, 0]
    (cell,) = results.cells()
    assert cell.accuracy == pytest.approx(4 / 6)
    assert cell.interval == pytest.approx(wilson(4, 6))
    assert "67% (30%-90%)" in repr(results)


async def test_the_three_methods_each_answer_every_item(server):
    items = tasks.BUILT_IN["count"].items(4_000, 2, seed=0)
    answers = {i.question: str(i.expected) for i in items}

    def reply(body):
        messages = body["messages"]
        if messages[0]["role"] == "system" and "Python REPL" in messages[0]["content"]:
            return "```repl\nanswer = llm_query(context[:100])\n```\nFINAL_VAR(answer)"
        return answers.get(question_of(body), "not found")  # every call answers whole

    server.reply_with("gpt-4o", reply)
    results = await evaluate(priced_rlm(server), "count", ["4k"], n=2, chunk_tokens=1_000)
    assert sorted(results.methods) == ["direct", "map", "rlm"]
    by_method = {m: results.select(method=m) for m in results.methods}
    assert [i.score for i in by_method["direct"]] == [1, 1]
    # The map's combining call was asked with every part's answer.
    combines = [r for r in server.requests if "Answers from the parts:" in str(r["messages"])]
    assert len(combines) == 2
    assert all(i.calls == 6 for i in by_method["map"])  # 5 chunks of ~1k tokens, 1 combine
    assert all(i.trajectory is not None and i.error is None for i in results.items)


async def test_costs_in_the_table_are_the_ledgers(server):
    server.usage = None  # ~4 characters a token, as billed
    server.reply_with("gpt-4o", "7")
    rlm = priced_rlm(server)
    evaluation = Evaluation(rlm, "niah,count", ["2k", "4k"], n=2, methods="direct,map")
    results = await evaluation.run()
    ledger = evaluation.ledger.summary()
    assert ledger.cost_usd is not None and ledger.cost_usd > 0
    assert results.cost_usd == pytest.approx(ledger.cost_usd, rel=1e-9)
    assert sum(c.cost_usd for c in results.cells()) == pytest.approx(ledger.cost_usd, rel=1e-9)
    assert sum(c.tokens for c in results.cells()) == ledger.input_tokens + ledger.output_tokens
    assert sum(i.calls for i in results.items) == ledger.calls == len(server.requests)
    assert rlm.usage().cost_usd == pytest.approx(ledger.cost_usd)  # the RLM's ledger too


async def test_a_dry_run_sends_nothing_and_counts_the_calls(server):
    rlm = priced_rlm(server)
    plan = await evaluate(
        rlm, "niah,count", "8k,64k", n=10, methods="direct,map", dry_run=True, chunk_tokens=16_000
    )
    assert isinstance(plan, EvalPlan)
    assert server.requests == []
    assert plan.items == 2 * 2 * 10 * 2
    # direct: one call an item; map: a call a chunk (8k: 1, 64k: 5) and a combining call.
    assert plan.calls == 40 * 1 + 20 * (1 + 1) + 20 * (5 + 1)
    assert plan.cost_usd is not None and plan.cost_usd > 0
    assert "Plan: 80 items, ~200 calls" in repr(plan)


async def test_the_direct_call_says_when_the_context_was_cut_to_the_window(server):
    server.reply_with("gpt-4o", "0")
    rlm = priced_rlm(server, context_window=3_000, max_tokens=500)
    results = await evaluate(rlm, "niah", ["8k"], n=1, methods="direct")
    (item,) = results.items
    assert "context cut to its first ~" in item.notes[0] and "3,000 tokens" in item.notes[0]
    assert len(server.requests[0]["messages"][-1]["content"]) < 3_000 * 4
    assert "1 direct calls had their context cut" in repr(results)


async def test_the_cost_budget_stops_the_evaluation_before_it_is_passed(server):
    server.usage = None
    server.reply_with("gpt-4o", "7")
    rlm = priced_rlm(server, max_tokens=100, max_concurrency=1)
    evaluation = Evaluation(rlm, "niah", ["2k"], n=10, methods="direct", max_cost_usd=0.05)
    results = await evaluation.run()
    assert results.stopped and "cost budget" in results.stopped
    assert 0 < len(server.requests) < 10
    assert evaluation.ledger.cost_usd <= 0.05


async def test_an_interrupt_keeps_the_finished_items(server, tmp_path):
    server.reply_with("gpt-4o", "7")
    slow = {i.question for i in tasks.BUILT_IN["niah"].items(2_000, 6, 0)[3:]}
    server.latency_for = lambda body: 30 if question_of(body) in slow else 0
    path = tmp_path / "items.jsonl"
    evaluation = Evaluation(priced_rlm(server), "niah", ["2k"], n=6, methods="direct", jsonl=path)
    run = asyncio.ensure_future(evaluation.run())
    await asyncio.to_thread(server.wait_for, lambda: len(server.requests) == 6)
    while len(evaluation.results) < 3:
        await asyncio.sleep(0.01)
    run.cancel()
    with pytest.raises(asyncio.CancelledError):
        await run
    assert len(evaluation.results) == 3 and evaluation.results.stopped == "interrupted"
    assert len(path.read_text().splitlines()) == 3


async def test_every_item_goes_to_the_jsonl_file_with_its_settings(server, tmp_path):
    server.reply_with("gpt-4o", "not found")
    path = tmp_path / "run.jsonl"
    results = await evaluate(
        priced_rlm(server), "pairs,niah", ["2k"], n=2, methods="direct,map", jsonl=path
    )
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert len(lines) == len(results.items) == 8
    assert {line["model"] for line in lines} == {PRICED}
    assert all(isinstance(line["expected"], (list, str)) for line in lines)
    assert all(line["trajectory"]["calls"] for line in lines)
    results.to_jsonl(tmp_path / "again.jsonl")
    assert len((tmp_path / "again.jsonl").read_text().splitlines()) == 8


async def test_a_task_of_ones_own(server):
    server.reply_with("gpt-4o", lambda body: "Paris" if "France" in question_of(body) else "?")
    mine = custom_task(
        "capitals",
        [
            ("France is a country.", "What is the capital of France?", "Paris"),
            ("Spain is a country.", "What is the capital of Spain?", "Madrid"),
        ],
    )
    results = await evaluate(priced_rlm(server), [mine], ["8k"], n=5, methods="direct")
    assert [i.score for i in results.items] == [1, 0]
    assert results.items[0].size == 0 and "as given" in repr(results)


def test_the_table_and_its_html_show_each_size_and_method():
    from rlm_magic.eval import ItemResult

    results = EvalResults()
    for method, score in (("rlm", 1.0), ("direct", 0.0)):
        results.add(ItemResult(method, "niah", 8000, 0, "q", "1", "1", score, cost_usd=0.01))
    text = repr(results)
    assert re.search(r"8k\s+rlm\s+1\s+100%", text) and re.search(r"8k\s+direct\s+1\s+0%", text)
    assert "<details>" in results._repr_html_()


# -- the magic --------------------------------------------------------------------------
def test_a_cell_starting_with_rlm_eval_is_awaited():
    from rlm_magic.jupyter.magics import transform_rlm_cell

    (line,) = transform_rlm_cell(["%rlm eval --tasks niah --n 2\n"])
    assert line.startswith("await ") and "run_eval('--tasks niah --n 2')" in line
    assert transform_rlm_cell(["%rlm usage\n"]) == ["%rlm usage\n"]


async def test_rlm_eval_dry_run_in_a_notebook_shows_the_plan(shell, server):
    plan = await run_cell(shell, "%rlm eval --tasks niah,count --sizes 8k --n 3 --dry-run")
    assert isinstance(plan, EvalPlan) and plan.items == 2 * 3 * 3
    assert server.requests == []


async def test_rlm_eval_stores_its_results_in_out(shell, server):
    server.reply_with("sub-model", "7")
    server.reply_with("root-model", "7")
    await run_cell(shell, "%rlm eval --tasks niah --sizes 2k --n 2 --methods direct --out ev")
    results = shell.user_ns["ev"]
    assert isinstance(results, EvalResults) and len(results) == 2


def test_the_combine_prompt_is_the_wording_the_demo_reads():
    from rlm_magic.demo.script import eval_reply

    prompt = COMBINE_PROMPT.format(
        question="How many records have the topic 'music'? Answer with a number only.",
        parts=2,
        answers="Part 1: 3\nPart 2: 4",
    )
    assert eval_reply(prompt) == "7"


@pytest.mark.parametrize("name", sorted(tasks.BUILT_IN))
def test_the_demo_model_answers_every_task_by_rule(name):
    # Offline, the notebook's evaluation measures the harness: the demo must be right
    # wherever it sees the whole context.
    from rlm_magic.demo.script import eval_reply
    from rlm_magic.eval.methods import DIRECT_PROMPT

    for item in tasks.BUILT_IN[name].items(8_000, 3, seed=1):
        answer = eval_reply(DIRECT_PROMPT.format(question=item.question, context=item.context))
        assert item.scorer(answer, item.expected) == 1, (item.question, answer)


def test_without_matplotlib_there_is_no_plot_and_no_error(monkeypatch):
    import sys

    from rlm_magic.eval import ItemResult

    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)  # its import fails
    results = EvalResults()
    results.add(ItemResult("rlm", "niah", 8000, 0, "q", "1", "1", 1.0))
    assert results.plot() is None and results.plot_png() is None


async def test_the_cost_budget_holds_rlm_runs_too(server):
    server.usage = None
    server.reply_with("gpt-4o", "FINAL(7)")
    rlm = priced_rlm(server, max_tokens=100, max_concurrency=1)
    evaluation = Evaluation(rlm, "niah", ["2k"], n=10, methods="rlm", max_cost_usd=0.02)
    results = await evaluation.run()
    assert results.stopped and "cost budget" in results.stopped
    assert 0 < len(server.requests) < 10
    assert evaluation.ledger.cost_usd <= 0.02
