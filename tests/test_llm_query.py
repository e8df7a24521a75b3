"""llm_query / llm_query_batch against a real HTTP server, through litellm."""

from __future__ import annotations

import asyncio
import socket
import time

import pytest

from rlm_magic import BatchError, LLMQueryError

from .support import SUB, helpers, make_rlm


async def test_llm_query_returns_the_models_answer(rlm, server):
    assert await helpers(rlm).llm_query("hello") == "echo: hello"
    assert server.requests[0]["model"] == "sub-model"


async def test_system_prompt_is_sent_first(rlm, server):
    await helpers(rlm).llm_query("hi", system="be brief")
    assert [m["role"] for m in server.requests[0]["messages"]] == ["system", "user"]


async def test_32_prompts_run_concurrently(server):
    rlm = make_rlm(server, max_concurrency=32)
    server.latency = 0.5
    started = time.perf_counter()
    answers = await helpers(rlm).llm_query_batch([f"p{i}" for i in range(32)])
    elapsed = time.perf_counter() - started
    assert len(answers) == 32
    assert server.peak_in_flight == 32
    assert elapsed < 1.5, f"32 x 0.5 s took {elapsed:.2f}s"


async def test_max_concurrency_caps_requests_in_flight(server):
    rlm = make_rlm(server, max_concurrency=4)
    server.latency = 0.05
    await helpers(rlm).llm_query_batch([f"p{i}" for i in range(20)])
    assert server.peak_in_flight == 4
    assert len(server.requests) == 20


async def test_a_changed_limit_applies_to_the_next_batch(server):
    rlm = make_rlm(server, max_concurrency=2)
    server.latency = 0.05
    await helpers(rlm).llm_query_batch(["a", "b", "c", "d"])
    assert server.peak_in_flight == 2
    rlm.max_concurrency = 4
    server.peak_in_flight = 0
    await helpers(rlm).llm_query_batch(["a", "b", "c", "d"])
    assert server.peak_in_flight == 4


async def test_batch_preserves_order_when_answers_arrive_out_of_order(rlm, server):
    prompts = [f"item{i}" for i in range(10)]
    # Later prompts answer sooner; the answers must still follow the prompts.
    server.latency_for = lambda body: 0.3 - 0.03 * int(body["messages"][-1]["content"][4:])
    answers = await helpers(rlm).llm_query_batch(prompts)
    assert answers == [f"echo: {p}" for p in prompts]


async def test_empty_batch_returns_empty_list_without_requests(rlm, server):
    assert await helpers(rlm).llm_query_batch([]) == []
    assert server.requests == []


async def test_one_failing_item_raises_batch_error_keeping_the_others(rlm, server):
    server.fail("500", times=10, match="bad")
    with pytest.raises(BatchError) as caught:
        await helpers(rlm).llm_query_batch(["ok1", "bad", "ok2"])
    error = caught.value
    assert "1 of 3 batch items failed" in str(error)
    assert error.results == ["echo: ok1", None, "echo: ok2"]
    assert list(error.errors) == [1]
    assert isinstance(error.errors[1], LLMQueryError)


async def test_return_exceptions_puts_errors_in_place(rlm, server):
    server.fail("500", times=10, match="bad")
    answers = await helpers(rlm).llm_query_batch(["ok1", "bad", "ok2"], return_exceptions=True)
    assert answers[0] == "echo: ok1" and answers[2] == "echo: ok2"
    assert isinstance(answers[1], LLMQueryError)


async def test_429_is_waited_out_without_using_retries(server):
    rlm = make_rlm(server, max_retries=0)
    server.fail("429", times=2, headers={"retry-after-ms": "50"})
    assert await helpers(rlm).llm_query("x") == "echo: x"
    assert len(server.requests) == 3  # our 2 tries again, none hidden inside the SDK
    [record] = rlm.client.ledger.records
    assert record.retries == 0 and record.rate_limited == 2 and record.error is None


async def test_500_exhausting_retries_names_model_and_cause(server):
    rlm = make_rlm(server, max_retries=1)
    server.fail("500", times=5)
    with pytest.raises(LLMQueryError) as caught:
        await helpers(rlm).llm_query("x")
    message = str(caught.value)
    assert "'openai/sub-model'" in message and "after 2 attempts" in message
    assert "injected server error" in message
    assert len(server.requests) == 2


async def test_authentication_errors_are_not_retried(rlm, server):
    server.fail("401", times=5)
    with pytest.raises(LLMQueryError, match="injected bad API key"):
        await helpers(rlm).llm_query("x")
    assert len(server.requests) == 1


async def test_an_error_names_the_kind_and_the_providers_sentence_once(rlm, server):
    server.fail("context")
    with pytest.raises(LLMQueryError) as caught:
        await helpers(rlm).llm_query("x")
    assert str(caught.value) == (
        "LLM call to 'openai/sub-model' failed: ContextWindowExceededError: request (23009 "
        "tokens) exceeds the available context size (4096 tokens), try increasing it"
    )


async def test_an_unreachable_endpoint_is_named(server):
    with socket.socket() as probe:  # a port nobody listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    endpoint = f"http://127.0.0.1:{port}/v1"
    rlm = make_rlm(server, api_base=endpoint, max_retries=0)
    with pytest.raises(LLMQueryError) as caught:
        await helpers(rlm).llm_query("x")
    message = str(caught.value)
    assert message.startswith(
        f"LLM call to 'openai/sub-model' failed: could not reach {endpoint} ("
    )
    assert "InternalServerError" not in message and len(message.splitlines()) == 1


async def test_an_unpriced_model_whose_calls_all_failed_shows_an_unknown_cost(rlm, server):
    server.fail("401")
    with pytest.raises(LLMQueryError):
        await helpers(rlm).llm_query("x")
    row = repr(rlm.usage()).splitlines()[-1]
    assert row.split()[:6] == ["openai/sub-model", "1", "0", "0", "0", "?"]  # cost: not $0


@pytest.mark.parametrize(
    "cost, shown",
    [(0.0, "$0.0000"), (0.00003, "<$0.0001"), (0.00012, "$0.0001"), (1234.5, "$1,234.50")],
)
def test_costs_are_shown_without_rounding_a_paid_call_to_zero(cost, shown):
    from rlm_magic.llm.usage import format_cost

    assert format_cost(cost) == shown


def test_a_ledger_keeps_its_latest_records_and_counts_them_all(monkeypatch):
    from rlm_magic.llm import usage

    monkeypatch.setattr(usage, "KEPT_RECORDS", 3)
    session = usage.UsageLedger()
    ledger = usage.UsageLedger(parent=session)
    for n in range(5):
        ledger.record(usage.CallRecord("m", input_tokens=n, output_tokens=1, cost_usd=0.5))
    assert [r.input_tokens for r in ledger.records] == [2, 3, 4]  # the latest, oldest first
    assert len(ledger) == len(session) == 5
    totals = ledger.summary().total
    assert (totals.calls, totals.input_tokens, totals.cost_usd) == (5, 10, 2.5)
    assert session.summary().total.calls == 5


async def test_the_run_status_starts_with_an_unknown_cost_not_zero(rlm):
    from rlm_magic.jupyter.progress import RunStatus

    line = RunStatus(rlm.start("q"), enabled=False).line()
    assert " | 0 tokens | ? | " in line and "$0" not in line


async def test_timeout_gives_a_clear_error(server):
    rlm = make_rlm(server, timeout=0.3, max_retries=0)
    server.fail("hang")
    started = time.perf_counter()
    with pytest.raises(LLMQueryError) as caught:
        await helpers(rlm).llm_query("x")
    assert time.perf_counter() - started < 3
    assert "timed out" in str(caught.value) or "timeout" in str(caught.value).lower()
    assert server.wait_for(lambda: server.in_flight == 0)


async def test_cancelling_a_batch_leaves_nothing_in_flight(rlm, server):
    server.latency = 30
    task = asyncio.ensure_future(helpers(rlm).llm_query_batch([f"p{i}" for i in range(8)]))
    assert await asyncio.to_thread(server.wait_for, lambda: server.in_flight == 8)
    tasks_before = asyncio.all_tasks()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert await asyncio.to_thread(server.wait_for, lambda: server.in_flight == 0)
    assert server.cancelled == 8
    leftover = [
        t
        for t in asyncio.all_tasks() - {asyncio.current_task()}
        if not t.done() and t in tasks_before
    ]
    assert leftover == []


async def test_usage_is_recorded_per_call(rlm, server):
    await helpers(rlm).llm_query_batch(["a", "b"])
    summary = rlm.usage()
    row = summary.by_model[SUB]
    assert (row.calls, row.input_tokens, row.output_tokens) == (2, 20, 10)
    assert row.cost_usd is None and row.unpriced_calls == 2  # unknown model: no price


async def test_known_models_are_priced(server):
    rlm = make_rlm(server, sub_model="openai/gpt-4o-mini")
    await helpers(rlm).llm_query("a")
    [record] = rlm.client.ledger.records
    assert record.cost_usd is not None and record.cost_usd > 0


async def test_cache_answers_a_repeat_without_a_request(server, tmp_path):
    rlm = make_rlm(server, cache=True, cache_dir=str(tmp_path))
    assert await helpers(rlm).llm_query("same") == "echo: same"
    assert await helpers(rlm).llm_query("same") == "echo: same"
    assert len(server.requests) == 1
    # A new RLM (as after a kernel restart) reads the same disk cache.
    again = make_rlm(server, cache=True, cache_dir=str(tmp_path))
    assert await helpers(again).llm_query("same") == "echo: same"
    assert len(server.requests) == 1
    hits = again.usage().by_model[SUB]
    assert hits.cache_hits == 1 and hits.cost_usd == 0.0


async def test_cache_key_includes_parameters(server, tmp_path):
    rlm = make_rlm(server, cache=True, cache_dir=str(tmp_path))
    await helpers(rlm).llm_query("same")
    await helpers(rlm).llm_query("same", max_tokens=7)
    await helpers(rlm).llm_query("same", system="s")
    assert len(server.requests) == 3


async def test_the_blocking_litellm_completion_is_never_called(rlm, server, monkeypatch):
    from rlm_magic.llm.litellm_loader import load_litellm

    litellm = await load_litellm()

    def forbidden(*args, **kwargs):
        raise AssertionError("litellm.completion must not be called")

    monkeypatch.setattr(litellm, "completion", forbidden)
    monkeypatch.setattr(litellm, "batch_completion", forbidden)
    await helpers(rlm).llm_query("a")
    await helpers(rlm).llm_query_batch(["b", "c"])
    assert len(server.requests) == 3


async def test_cancelled_calls_are_counted_apart_from_errors(rlm, server):
    server.latency = 30
    task = asyncio.ensure_future(helpers(rlm).llm_query_batch(["a", "b", "c"]))
    assert await asyncio.to_thread(server.wait_for, lambda: server.in_flight == 3)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    total = rlm.usage().total
    assert (total.calls, total.cancelled, total.errors) == (3, 3, 0)
    assert repr(rlm.usage()).splitlines()[0].split()[-2:] == ["errors", "cancelled"]


async def test_bad_prompts_are_rejected_with_one_line_errors(rlm):
    from rlm_magic import ConfigError

    with pytest.raises(ConfigError, match="expects a list of prompts, got str"):
        await helpers(rlm).llm_query_batch("one prompt")
    with pytest.raises(ConfigError, match="prompt 1 is a int"):
        await helpers(rlm).llm_query_batch(["a", 2])
    with pytest.raises(ConfigError, match="expects the prompt as a str"):
        await helpers(rlm).llm_query(42)
    with pytest.raises(ConfigError, match="max_tokens must be a positive int"):
        await helpers(rlm).llm_query("a", max_tokens=0)


async def test_max_tokens_and_litellm_kwargs_reach_the_provider(server):
    rlm = make_rlm(server, max_tokens=77, litellm_kwargs={"temperature": 0.25})
    await helpers(rlm).llm_query("a")
    await helpers(rlm).llm_query("b", max_tokens=5)
    first, second = server.requests
    assert (first["max_tokens"], first["temperature"]) == (77, 0.25)
    assert second["max_tokens"] == 5


async def test_a_broken_cache_does_not_lose_the_answer(server, tmp_path, monkeypatch):
    rlm = make_rlm(server, cache=True, cache_dir=str(tmp_path))

    def broken(*args):
        raise OSError("disk full")

    monkeypatch.setattr(rlm.client.cache, "set", broken)
    from rlm_magic.llm import cache

    monkeypatch.setattr(cache, "_warned", False)
    with pytest.warns(RuntimeWarning, match="cache is not working"):
        assert await helpers(rlm).llm_query("x") == "echo: x"


async def test_an_unusable_cache_directory_does_not_fail_the_call(server):
    rlm = make_rlm(server, cache=True, cache_dir="/proc/no-such-place/cache")
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert await helpers(rlm).llm_query("x") == "echo: x"


def test_errors_render_as_one_line_in_ipython():
    from rlm_magic import ConfigError

    assert ConfigError("bad value")._render_traceback_() == ["ConfigError: bad value"]
    error = LLMQueryError("openai/m", TimeoutError("slow"))
    assert error._render_traceback_() == [
        "LLMQueryError: LLM call to 'openai/m' failed: TimeoutError: slow"
    ]
