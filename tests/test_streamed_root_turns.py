"""Streamed root turns, timeouts that fit slow servers, early block execution and prompt
caching, driven through litellm over HTTP against the local test server.

The server streams each reply word by word (``token_delay`` apart), can stall in the
middle of a stream, speaks Anthropic's Messages API, and plays the providers' prompt
caches.
"""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from rlm_magic.demo import split_tokens
from rlm_magic.errors import LLMQueryError
from rlm_magic.jupyter.progress import RunStatus
from rlm_magic.llm import profiles
from rlm_magic.llm.completion import partial_answer

from .support import make_rlm

CLAUDE = "anthropic/claude-sonnet-4-5"  # litellm knows its prices, cache prices included


def repl(code: str, text: str = "") -> str:
    return f"{text}\n```repl\n{code}\n```\n"


def prose(words: int) -> str:
    return " ".join(f"word{i}" for i in range(words))


# -- streaming root turns ---------------------------------------------------------------


async def test_a_streamed_run_records_the_same_trajectory_and_usage_as_a_plain_one(server):
    replies = [repl("x = 6 * 7\nprint(x)", "Let me compute."), "Done.\nFINAL(42)"]
    outcomes = []
    for stream in (True, False):
        server.reset()
        server.script("root-model", list(replies))
        outcomes.append(await make_rlm(server, stream=stream).arun("q", context="c"))
        asked = server.requests_for("root-model")
        assert all(bool(r.get("stream")) is stream for r in asked)
    streamed, plain = outcomes
    assert streamed.final_answer == plain.final_answer == "42"
    assert [i.response for i in streamed.trajectory] == [i.response for i in plain.trajectory]
    assert [c.output for i in streamed.trajectory for c in i.code] == ["42"]
    assert (
        (streamed.usage.input_tokens, streamed.usage.output_tokens)
        == (plain.usage.input_tokens, plain.usage.output_tokens)
        == (20, 10)
    )


async def test_a_streamed_call_asks_for_usage_in_the_stream(rlm, server):
    await rlm.client.complete(
        [{"role": "user", "content": "hi"}], model="openai/root-model", stream=True
    )
    assert server.requests[-1]["stream_options"] == {"include_usage": True}


async def test_usage_is_counted_when_the_provider_leaves_it_out_of_the_stream(rlm, server):
    server.stream_usage, server.usage = False, None
    server.default_reply = lambda body: prose(30)
    done = await rlm.client.complete(
        [{"role": "user", "content": "say thirty words"}], model="openai/root-model", stream=True
    )
    assert done.text == prose(30)
    assert done.output_tokens >= 30 and done.input_tokens > 0
    assert rlm.client.ledger.records[-1].output_tokens == done.output_tokens


async def test_the_status_line_shows_the_turn_as_it_streams_in(server):
    # About 2 s of streaming: the line is read a few words in, long before the end
    # even if the loop is held up for a second.
    server.token_delay = 0.05
    server.script(
        "root-model", ["Thinking about the question first. " + prose(40) + "\nFINAL(done)"]
    )
    rlm = make_rlm(server)
    run = rlm.start("q", context="c")
    task = asyncio.ensure_future(run.execute())
    status = RunStatus(run, enabled=False)
    while not (run.tree.live_turn and "word3" in run.tree.live_turn.text):
        await asyncio.sleep(0.01)
    line, finished = status.line(), server.completed
    assert "thinking: …" in line and "word" in line and "FINAL" not in line
    assert finished == 0, "the server had already finished the turn"
    assert (await task).final_answer == "done"
    assert run.tree.live_turn is None


async def test_an_interrupt_closes_the_stream_at_once_and_keeps_its_tokens(rlm, server):
    server.token_delay, server.usage = 0.2, None
    server.default_reply = lambda body: prose(50)
    pieces = []
    call = asyncio.ensure_future(
        rlm.client.complete(
            [{"role": "user", "content": "long"}],
            model="openai/root-model",
            stream=True,
            on_text=pieces.append,
        )
    )
    while len(pieces) < 3:
        await asyncio.sleep(0.01)
    cancelled_at = time.perf_counter()
    call.cancel()
    with pytest.raises(asyncio.CancelledError) as raised:
        await call
    assert server.wait_for(lambda: server.cancelled == 1, timeout=10)
    assert time.perf_counter() - cancelled_at < 1.0
    # What had arrived is kept and counted, as an answer the interrupt cut off.
    cut = partial_answer(raised.value)
    assert cut is not None and cut.text.text == "".join(pieces) and cut.cut_reason == "interrupted"
    record = rlm.client.ledger.records[-1]
    assert record.error == "cancelled"
    assert record.output_tokens >= 3 and record.input_tokens > 0


# -- timeouts that fit slow servers ---------------------------------------------------


async def test_a_slow_but_steady_stream_is_never_cut_off_by_the_timeout(server):
    rlm = make_rlm(server, timeout=0.5)
    server.token_delay = 0.06
    server.default_reply = lambda body: prose(25)  # 1.5 s in all, 0.06 s per token
    done = await rlm.client.complete(
        [{"role": "user", "content": "q"}], model="openai/root-model", stream=True
    )
    assert done.text == prose(25) and done.retries == 0
    assert len(server.requests) == 1


async def test_a_stalled_stream_returns_what_it_received_marked_and_bills_it(server):
    rlm = make_rlm(server, timeout=0.5)  # retries allowed: a stall is not started again
    server.usage = None
    server.stall_at, server.stall_for = 5, 30
    server.default_reply = lambda body: prose(20)
    done = await rlm.client.complete(
        [{"role": "user", "content": "q"}], model="openai/root-model", stream=True
    )
    received = "".join(split_tokens(prose(20))[:5])
    assert done.text == (
        f"{received}\n[answer cut off: no new tokens for 0.5s after "
        f"{len(received)} characters (timeout=0.5s)]"
    )
    assert done.cut_reason and not done.cut_off  # not max_tokens: broke off
    assert len(server.requests) == 1
    record = rlm.client.ledger.records[-1]
    assert record.error is None and record.cut_off
    assert record.output_tokens >= 5 and record.input_tokens > 0


LIST_ANSWER = "FINAL(1) Paris 2) Berlin 3) Rome)"  # read whole only up to its last ')'


async def test_a_root_turn_broken_off_inside_final_is_not_taken_as_the_answer(server):
    rlm = make_rlm(server, timeout=0.5)
    server.stall_at, server.stall_for = 4, 30  # "FINAL(1) Paris 2) Berlin " then nothing
    server.script("root-model", [LIST_ANSWER, "FINAL(done)"])
    result = await rlm.arun("q", context="c")
    assert result.success and result.final_answer == "done"
    told = server.requests_for("root-model")[1]["messages"][-1]["content"]
    assert "Your reply was cut off before its end inside FINAL(...)" in told


async def test_a_last_turn_broken_off_inside_final_is_no_success(server):
    rlm = make_rlm(server, timeout=0.5, max_iterations=1)
    server.stall_at, server.stall_for = 4, 30  # the first reply is shorter than that
    server.script("root-model", ["Thinking.", LIST_ANSWER])
    result = await rlm.arun("q", context="c")
    assert not result.success and result.stop_reason == "max_iterations"


async def test_a_sub_call_answer_that_broke_off_counts_as_cut(server):
    server.reply_with("sub-model", lambda body: prose(20))
    server.drop_at = 10  # the root's replies are shorter than that
    server.script("root-model", [repl("part = llm_query('q')"), "FINAL(done)"])
    result = await make_rlm(server, sandbox="none").arun("q", context="c")
    assert result.trajectory[0].cut_answers == 1
    assert (
        "1 sub-call answer of this step is cut off"
        in server.requests_for("root-model")[1]["messages"][-1]["content"]
    )


async def test_calls_in_a_step_end_before_the_step_so_the_model_sees_their_errors(server):
    rlm = make_rlm(server, step_timeout=1.5, timeout=120, max_retries=2)
    server.model_latency["sub-model"] = 60  # a server far slower than the step allows
    server.script(
        "root-model", [repl("answers = llm_query_batch(['a', 'b'])\nprint(answers)"), "FINAL(over)"]
    )
    started = time.perf_counter()
    result = await rlm.arun("q", context="c")
    step = result.trajectory[0].code[0]
    assert step.elapsed_s < 1.5, "the step was killed instead of ending by itself"
    assert "Error:" in step.output and "step_timeout" in step.output
    assert "ran longer than" not in step.output
    assert "Error:" in server.requests_for("root-model")[-1]["messages"][-1]["content"]
    assert time.perf_counter() - started < 10


async def test_a_call_made_with_no_time_left_is_not_retried_past_its_deadline(server):
    rlm = make_rlm(server, timeout=120, max_retries=5, retry_backoff=0.01)
    server.fail("500", times=100)
    started = time.monotonic()
    with pytest.raises(LLMQueryError):
        await rlm.client.complete(
            [{"role": "user", "content": "q"}], model="openai/x", deadline=started + 1.0
        )
    assert time.monotonic() - started < 1.0


# -- early block execution ----------------------------------------------------------------


async def test_an_early_block_starts_while_the_model_still_writes(server):
    rlm = make_rlm(server, early_execution=True)
    server.token_delay = 0.02
    server.script(
        "root-model",
        [
            repl("print(llm_query('ping'))", "First:")
            + "Now some prose after the code. "
            + prose(40),
            "FINAL(done)",
        ],
    )
    result = await rlm.arun("q", context="c")
    assert result.final_answer == "done"
    first_turn = result.trajectory[0]
    assert first_turn.early_blocks == 1
    assert first_turn.code[0].output == "echo: ping"
    # The sub-call reached the server before the root turn had finished streaming.
    sub_at = server.arrivals[server.index_of("ping")]
    assert sub_at < server.arrivals[0] + 40 * 0.02
    assert (
        "Output of block 1:\necho: ping"
        in server.requests_for("root-model")[1]["messages"][-1]["content"]
    )


async def test_early_execution_keeps_block_order_and_what_the_model_sees(server):
    reply = repl("a = 1\nprint('one')") + "middle " + repl("print('two', a)") + prose(10)
    seen = []
    for early in (False, True):
        server.reset()
        server.token_delay = 0.005
        server.script("root-model", [reply, "FINAL(x)"])
        await make_rlm(server, early_execution=early).arun("q", context="c")
        seen.append(server.requests_for("root-model")[1]["messages"])
    assert seen[0] == seen[1]


async def test_a_turn_cut_off_after_its_code_ran_stands_and_the_run_goes_on(server):
    rlm = make_rlm(server, early_execution=True, timeout=0.5, max_retries=2)
    server.stall_at, server.stall_for = 12, 30
    server.script("root-model", [repl("ran = True\nprint('ran')") + prose(20), "FINAL(done)"])
    result = await rlm.arun("q", context="c")
    assert result.success and result.final_answer == "done"
    first = result.trajectory[0]
    assert "no new tokens for 0.5s" in first.broken_off
    assert [c.output for c in first.code] == ["ran"]  # run once: not asked again
    assert len(server.requests_for("root-model")) == 2
    told = server.requests_for("root-model")[1]["messages"][-1]["content"]
    assert told.startswith("(Your reply was cut off after its code had run")
    assert "ran" in told and result.variables["ran"] is True


# -- prompt caching ---------------------------------------------------------------------


def claude_rlm(server, **settings):
    return make_rlm(
        server, model=CLAUDE, sub_model=CLAUDE, api_base=server.anthropic_base, **settings
    )


def long_turns(count: int) -> list[str]:
    return [repl(f"print('{'x' * 2000}')", f"Step {i}.") for i in range(count)] + ["FINAL(ok)"]


async def test_anthropic_root_turns_carry_cache_markers_and_cached_tokens_reach_usage(server):
    server.usage = None
    server.script("claude-sonnet-4-5", long_turns(3))
    result = await claude_rlm(server).arun("q", context="c")
    assert result.final_answer == "ok"
    assert server.cache_markers == [2, 3, 3, 3]  # system prompt + the newest user turns
    total = result.usage.total
    assert total.cached_input_tokens > 0 and total.cache_write_tokens > 0
    assert total.cache_saved_usd > 0, "four turns of a growing prefix should save"
    assert "cached input" in repr(result.usage) and "cache saved" in repr(result.usage)


async def test_the_cache_markers_are_not_sent_with_prompt_caching_off(server):
    server.usage = None
    server.script("claude-sonnet-4-5", long_turns(1))
    result = await claude_rlm(server, prompt_caching=False).arun("q", context="c")
    assert server.cache_markers == [0, 0]
    assert result.usage.total.cached_input_tokens == 0
    assert "cached input" not in repr(result.usage)


async def test_openai_style_providers_get_no_markers_but_their_cached_tokens_count(server):
    server.usage, server.auto_cache = None, True
    server.script("root-model", long_turns(2))
    result = await make_rlm(server).arun("q", context="c")
    roots = server.requests_for("root-model")
    assert all(isinstance(m["content"], str) for r in roots for m in r["messages"])
    assert result.usage.total.cached_input_tokens > 0


async def test_a_provider_that_rejects_markers_is_asked_again_without_them(server):
    server.fail("400-markers", times=1)
    server.script("claude-sonnet-4-5", ["FINAL(fine)", "FINAL(again)"])
    try:
        result = await claude_rlm(server).arun("q", context="c")
        assert result.final_answer == "fine"
        assert server.cache_markers == [2, 0]
        assert result.usage.total.retries == 0
        await claude_rlm(server).arun("q", context="c")
        assert server.cache_markers == [2, 0, 0], "the refusal is remembered"
    finally:
        profiles.forget()


async def test_the_status_line_shows_cached_input_and_the_saving(server):
    server.usage = None
    server.script("claude-sonnet-4-5", long_turns(2))
    rlm = claude_rlm(server)
    run = rlm.start("q", context="c")
    await run.execute()
    line = RunStatus(run, enabled=False).line("done")
    assert " cached, saved $" in line


async def test_an_interrupt_while_an_early_block_runs_stops_both_and_keeps_the_block(server):
    # In-process: the test hands the block a threading.Event as its context.
    rlm = make_rlm(server, early_execution=True, sandbox="none")
    server.token_delay = 0.1
    server.script(
        "root-model",
        [
            repl("print(llm_query('started'))\ncontext.set()\nimport time\ntime.sleep(30)")
            + prose(100)
        ],
    )
    printed = threading.Event()  # the block sets it once it has printed
    run = rlm.start("q", context=printed)
    task = asyncio.ensure_future(run.execute())
    assert await asyncio.to_thread(printed.wait, 10)
    # The sub-call is done (the server counts it just after its answer left); the
    # streamed turn is not.
    assert await asyncio.to_thread(server.wait_for, lambda: server.completed >= 1, 10)
    assert server.completed == 1, "the turn should still be streaming"
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert server.wait_for(lambda: server.cancelled == 1, timeout=10), "the stream stayed open"
    assert run.result.stop_reason == "interrupted"
    [block] = run.result.trajectory[0].code
    assert block.error and "started" in block.output


async def test_a_streamed_answer_teaches_the_rate_gate_the_providers_limits(server):
    rlm = make_rlm(server, api_base=server.base_url + "/")  # a gate of its own
    server.limit_rate(rps=50, burst=20)
    # Enough answers at once that the headers' remaining count says something.
    await asyncio.gather(
        *(
            rlm.client.complete(
                [{"role": "user", "content": f"q{i}"}], model="openai/stream-x", stream=True
            )
            for i in range(14)
        )
    )
    assert rlm.client.gate("openai/stream-x").requests.capacity == 20  # the burst it said


async def test_a_provider_that_cannot_stream_is_asked_plainly_from_then_on(server):
    server.fail("400-stream", times=1)
    try:
        done = await make_rlm(server).client.complete(
            [{"role": "user", "content": "q"}], model="openai/no-stream", stream=True
        )
        assert done.text == "echo: q" and not done.streamed and done.retries == 0
        assert [bool(r.get("stream")) for r in server.requests] == [True, False]
        await make_rlm(server).client.complete(
            [{"role": "user", "content": "again"}], model="openai/no-stream", stream=True
        )
        assert not server.requests[-1].get("stream")
    finally:
        profiles.forget()


async def test_a_call_whose_deadline_has_passed_is_not_sent(rlm, server):
    with pytest.raises(LLMQueryError, match="time ran out before it could be sent"):
        await rlm.client.complete(
            [{"role": "user", "content": "late"}], model="openai/x", deadline=time.monotonic() - 0.1
        )
    assert server.requests == []
    assert rlm.client.ledger.records[-1].error


async def test_a_child_run_ends_within_its_parents_step(server):
    rlm = make_rlm(server, step_timeout=1.5, max_depth=1)
    server.script("root-model", [repl("print(rlm_query('dig', context='x'))"), "FINAL(up)"])
    # The child (on the sub-model) only ever writes steps that would sleep far past the
    # parent's: it can only end when its time is up.
    server.reply_with("sub-model", repl("import time\ntime.sleep(30)"))
    result = await rlm.arun("q", context="c")
    step = result.trajectory[0].code[0]
    assert step.elapsed_s < 1.5, "the parent's step was killed instead of ending by itself"
    assert "Error: child RLM failed" in step.output


# -- settings -----------------------------------------------------------------------------


def test_streaming_early_execution_and_prompt_caching_are_on_by_default():
    from rlm_magic import RLM

    rlm = RLM()
    assert (rlm.stream, rlm.early_execution, rlm.prompt_caching) == (True, True, True)
    assert {"stream", "early_execution", "prompt_caching"} <= set(rlm.settings())


def test_litellm_kwargs_may_not_set_the_streams_options():
    from traitlets import TraitError

    from rlm_magic import RLM

    with pytest.raises(TraitError, match="may not set stream_options"):
        RLM(litellm_kwargs={"stream_options": {"include_usage": False}})


async def test_rlm_usage_shows_cached_input_and_the_saving(shell, server):
    from .support import run_cell

    server.usage = None
    shell.run_line_magic("rlm", "usage --reset")
    server.script("claude-sonnet-4-5", long_turns(2))
    shell.user_ns["ctx"] = "c"
    for line in (f'RLM.model = "{CLAUDE}"', f'RLM.api_base = "{server.anthropic_base}"'):
        shell.run_line_magic("config", line)
    await run_cell(shell, "%%rlm -c ctx -q\nWhat is it?")
    table = shell.run_line_magic("rlm", "usage")
    header, _, row = repr(table.summary).splitlines()[:3]  # the whole table, unfitted
    assert header.split()[-4:] == ["cached", "input", "cache", "saved"]
    assert row.startswith(CLAUDE) and row.split()[-1].startswith("$")
    assert "<th>cached input</th><th>cache saved</th>" in table._repr_html_()


async def test_an_interrupt_that_lands_while_a_stream_closes_is_not_lost():
    from rlm_magic.llm.streaming import StreamState, stream_completion

    closing = asyncio.Event()

    class Stream:  # a stream that has ended, and takes a moment to close
        def __aiter__(self):
            return self

        async def __anext__(self):
            raise StopAsyncIteration

        async def aclose(self):
            closing.set()
            await asyncio.sleep(0.05)

    async def acompletion(**request):
        return Stream()

    task = asyncio.ensure_future(
        stream_completion(acompletion, {}, StreamState(None), stall_timeout=5)
    )
    await closing.wait()
    task.cancel()  # the user's interrupt, while the finished stream closes
    with pytest.raises(asyncio.CancelledError):
        await task
