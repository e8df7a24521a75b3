"""The RLM loop, its REPL and its limits, with a scripted root model over real HTTP.

Root and sub-calls are told apart by model name: the root model is "root-model" and
sub-calls go to "sub-model" at the server.
"""

from __future__ import annotations

import asyncio
import json
import os
import time

import pytest

from rlm_magic import RLM, RLMResult

from .support import last_feedback, make_rlm, repl, root_requests, sub_requests
from .support.backends import SANDBOXES, THREADED_SANDBOXES


@pytest.fixture(params=SANDBOXES)
def repl_kind(request) -> str:
    """Run a REPL behaviour test on every backend: the sandbox process, WebAssembly and
    kernel threads."""
    return request.param


@pytest.fixture(params=THREADED_SANDBOXES)
def threaded_kind(request) -> str:
    return request.param


# -- finishing -----------------------------------------------------------------------


async def test_final_on_its_own_line_ends_the_run(rlm, server):
    server.script("root-model", ["I know it.\nFINAL(forty-two)"])
    result = await rlm.arun("What is the answer?", context="ctx")
    assert result.success and result.final_answer == "forty-two"
    assert result.iterations == 1 and result.stop_reason == "final"


async def test_final_var_returns_a_repl_variable(rlm, server):
    server.script("root-model", [repl("total = sum(range(5))"), "FINAL_VAR(total)"])
    result = await rlm.arun("sum?", context=[1])
    assert result.final_answer == "10"


async def test_final_var_in_the_same_reply_sees_that_replys_code(rlm, server):
    server.script("root-model", [repl("word = context.upper()") + "FINAL_VAR(word)"])
    result = await rlm.arun("shout", context="hi")
    assert result.final_answer == "HI"


async def test_final_var_of_a_missing_variable_is_reported_to_the_model(rlm, server):
    server.script("root-model", ["FINAL_VAR(nope)", "FINAL(recovered)"])
    result = await rlm.arun("q", context="c")
    assert result.final_answer == "recovered"
    assert "no variable named 'nope'" in last_feedback(server)


async def test_answer_dict_protocol_ends_the_run(rlm, server):
    server.script("root-model", [repl('answer["content"] = "via dict"\nanswer["ready"] = True')])
    result = await rlm.arun("q", context="c")
    assert result.final_answer == "via dict" and result.iterations == 1


async def test_final_in_printed_data_a_comment_or_mid_sentence_is_not_an_answer(rlm, server):
    server.script(
        "root-model",
        [
            repl("print(context)\n# FINAL(nor this)") + "I will call FINAL(x) later.",
            "FINAL(the real one)",
        ],
    )
    result = await rlm.arun("q", context="FINAL(not this)\n")
    assert result.final_answer == "the real one" and result.iterations == 2


async def test_multiline_final(rlm, server):
    server.script("root-model", ["FINAL(line one\nline two)"])
    assert (await rlm.arun("q", context="c")).final_answer == "line one\nline two"


# -- the REPL ------------------------------------------------------------------------


async def test_code_output_errors_and_last_value_go_back_to_the_model(rlm, server, repl_kind):
    rlm.sandbox = repl_kind
    server.script("root-model", [repl("print('hello')\n1 + 1"), repl("1/0"), "FINAL(done)"])
    result = await rlm.arun("q", context="c")
    first, second = (it.code[0].output for it in result.trajectory[:2])
    assert first == "hello\n2"
    assert "ZeroDivisionError: division by zero" in second and "1/0" in second
    assert result.trajectory[1].code[0].error


async def test_python_fences_run_too_and_state_persists(rlm, server):
    server.script(
        "root-model",
        ["```python\nx = 3\n```\n```repl\ny = x * 2\ny\n```", repl("x + y"), "FINAL(ok)"],
    )
    result = await rlm.arun("q", context="c")
    assert result.trajectory[0].code[1].output == "6"
    assert result.trajectory[1].code[0].output == "9"


async def test_long_output_is_cut_with_a_note(server, repl_kind):
    rlm = make_rlm(server, max_output_chars=100, sandbox=repl_kind)
    server.script("root-model", [repl("print('x' * 5000)"), "FINAL(ok)"])
    result = await rlm.arun("q", context="c")
    seen = result.trajectory[0].code[0].output
    assert seen.startswith("x" * 100)
    assert "[output cut: 4,900 more characters" in seen
    assert len(seen) < 200


@pytest.mark.parametrize(
    "style, code",
    [
        ("await", "answers = await llm_query_batch([f'q{i}' for i in range(8)])"),
        ("no-await", "answers = llm_query_batch([f'q{i}' for i in range(8)])"),
        (
            "inside-def",
            "def ask(n):\n    return llm_query_batch([f'q{i}' for i in range(n)])\n"
            "answers = ask(8)",
        ),
        (
            "async-def-gather",
            "async def one(p):\n    return await llm_query(p)\n"
            "answers = await asyncio.gather(*[one(f'q{i}') for i in range(8)])",
        ),
        (
            "gather-of-calls",
            "answers = await asyncio.gather(*[llm_query(f'q{i}') for i in range(8)])",
        ),
        (
            "comprehension",
            "answers = [a for batch in [llm_query_batch([f'q{i}' for i in range(8)])]"
            " for a in batch]",
        ),
    ],
)
async def test_batches_run_concurrently_in_every_style(rlm, server, style, code, repl_kind):
    rlm.sandbox = repl_kind
    server.model_latency = {"sub-model": 0.4}
    server.script("root-model", [repl(code + "\nprint(len(answers), answers[0])"), "FINAL(ok)"])
    result = await rlm.arun("q", context="c")
    assert result.trajectory[0].code[0].output == "8 echo: q0", style
    assert server.peak_in_flight == 8, style
    assert result.trajectory[0].code[0].elapsed_s < 8 * 0.4, style


async def test_blocking_model_code_does_not_block_the_loop(rlm, server, repl_kind):
    rlm.sandbox = repl_kind
    server.script("root-model", [repl("import time\ntime.sleep(0.5)"), "FINAL(ok)"])
    ticks = 0

    async def heartbeat():
        nonlocal ticks
        while True:
            await asyncio.sleep(0.01)
            ticks += 1

    beat = asyncio.ensure_future(heartbeat())
    await rlm.arun("q", context="c")
    beat.cancel()
    assert ticks > 20  # the loop kept turning while the step slept


# -- errors as values, pinning, recursion --------------------------------------------


async def test_failed_sub_calls_are_error_strings_and_the_rest_survive(rlm, server):
    server.fail("500", times=10, model="sub-model", match="bad")
    server.script(
        "root-model",
        [
            repl(
                "out = llm_query_batch(['ok', 'bad', 'fine'])\n"
                "one = llm_query('bad')\nprint(out)\nprint(one)"
            ),
            "FINAL(ok)",
        ],
    )
    rlm.max_retries = 0
    result = await rlm.arun("q", context="c")
    seen = result.trajectory[0].code[0].output
    assert "['echo: ok', \"Error: LLM call to 'openai/sub-model' failed" in seen
    assert "'echo: fine']" in seen
    assert seen.splitlines()[1].startswith("Error: LLM call")
    assert result.success


async def test_model_code_cannot_switch_models(rlm, server):
    server.script(
        "root-model",
        [
            repl("llm_query('a', model='gpt-4-32k')\nllm_query_batch(['b'], model='o1-pro')"),
            "FINAL(ok)",
        ],
    )
    await rlm.arun("q", context="c")
    assert {r["model"] for r in server.requests} == {"root-model", "sub-model"}


async def test_rlm_query_runs_a_child_rlm_on_the_sub_model(rlm, server):
    server.script(
        "root-model",
        [repl("r = rlm_query('count it', context=[1, 2, 3])\nprint(r)"), "FINAL(parent done)"],
    )
    # The child RLM's root model is the sub-model.
    server.script("sub-model", [repl("n = len(context)"), "FINAL_VAR(n)"])
    result = await rlm.arun("q", context="c")
    assert result.trajectory[0].code[0].output == "3"
    assert result.usage.by_model["openai/sub-model"].calls == 2  # child's two turns
    child_system = sub_requests(server)[0]["messages"][0]["content"]
    assert "list, length 3" in child_system


async def test_at_max_depth_rlm_query_is_a_plain_llm_query(server):
    rlm = make_rlm(server, max_depth=0)
    server.script("root-model", [repl("print(rlm_query('just ask'))"), "FINAL(ok)"])
    result = await rlm.arun("q", context="c")
    assert result.trajectory[0].code[0].output == "echo: just ask"
    [sub] = sub_requests(server)
    assert sub["messages"] == [{"role": "user", "content": "just ask"}]


async def test_children_fall_back_to_llm_query_at_the_depth_limit(rlm, server):
    # max_depth=1: the child's own rlm_query must not start a grandchild.
    server.script("root-model", [repl("print(rlm_query('go'))"), "FINAL(ok)"])

    def sub_model(body):
        if body["messages"][0]["role"] != "system":
            return "plain answer"  # a plain llm_query, not a child RLM's turn
        child_turn = sum(m["role"] == "assistant" for m in body["messages"])
        return repl("print(rlm_query('deeper'))") if child_turn == 0 else "FINAL(child ok)"

    server.reply_with("sub-model", sub_model)
    result = await rlm.arun("q", context="c")
    assert result.trajectory[0].code[0].output == "child ok"
    plain = [r for r in sub_requests(server) if r["messages"][-1]["content"] == "deeper"]
    assert len(plain) == 1 and len(plain[0]["messages"]) == 1
    assert "plain answer" in json.dumps(sub_requests(server)[-1])


async def test_rlm_query_batch_runs_children_concurrently(rlm, server):
    server.model_latency = {"sub-model": 0.3}
    server.script("root-model", [repl("print(rlm_query_batch(['a', 'b', 'c', 'd']))"), "FINAL(ok)"])
    server.reply_with("sub-model", "FINAL(child)")
    result = await rlm.arun("q", context="c")
    assert result.trajectory[0].code[0].output == str(["child"] * 4)
    assert server.peak_in_flight == 4


# -- limits --------------------------------------------------------------------------


async def test_at_max_iterations_the_model_is_asked_once_for_its_answer(server):
    rlm = make_rlm(server, max_iterations=2)
    server.script("root-model", [repl("x = 1"), repl("x += 1"), "FINAL(best guess)"])
    result = await rlm.arun("q", context="c")
    assert result.final_answer == "best guess" and result.success
    assert len(root_requests(server)) == 3
    assert "iteration limit" in root_requests(server)[-1]["messages"][-1]["content"]


async def test_no_answer_at_max_iterations_is_a_failure_with_the_last_reply(server):
    rlm = make_rlm(server, max_iterations=1)
    server.script("root-model", [repl("x = 1"), "still thinking"])
    result = await rlm.arun("q", context="c")
    assert not result.success and result.stop_reason == "max_iterations"
    assert result.final_answer == "still thinking"
    assert "max_iterations=1" in result.error


async def test_max_sub_calls_stops_requests_with_error_strings(server):
    rlm = make_rlm(server, max_sub_calls=3)
    server.script(
        "root-model",
        [
            repl(
                "out = llm_query_batch(['a', 'b', 'c', 'd', 'e'])\n"
                "print(out[2]); print(out[3]); print(llm_query('f'))"
            ),
            "FINAL(ok)",
        ],
    )
    result = await rlm.arun("q", context="c")
    lines = result.trajectory[0].code[0].output.splitlines()
    assert lines[0] == "echo: c"
    assert lines[1].startswith("Error: max_sub_calls=3 reached") and lines[2] == lines[1]
    assert len(sub_requests(server)) == 3


async def test_max_cost_usd_stops_the_run_with_a_partial_result(server):
    rlm = make_rlm(server, model="openai/gpt-4o", max_cost_usd=0.001)
    server.script("gpt-4o", [repl("x = 1"), "FINAL(too late)"])
    result = await rlm.arun("q", context="c")
    # Its first turn could cost ~$0.045 (4,096 tokens of answer): it is not sent.
    assert not result.success and result.stop_reason == "budget"
    assert result.error.startswith("stopped by the cost budget: not sent to 'openai/gpt-4o'")
    assert "max_cost_usd=$0.001 has $0.0010 left" in result.error
    assert result.iterations == 0 and not server.requests_for("gpt-4o")


@pytest.mark.filterwarnings("ignore:max_cost_usd is set")  # the root model is unpriced
async def test_sub_calls_past_the_budget_send_nothing(server):
    rlm = make_rlm(server, sub_model="openai/gpt-4o", max_cost_usd=0.001)
    server.script(
        "root-model",
        [repl("a = llm_query('first')\nb = llm_query('second')\nprint(b)"), "FINAL(x)"],
    )
    result = await rlm.arun("q", context="c")
    seen = result.trajectory[0].code[0].output
    assert seen.startswith("Error: not sent to 'openai/gpt-4o': it could cost up to $0.04")
    assert seen.endswith("max_cost_usd=$0.001 has $0.0010 left")
    assert not server.requests_for("gpt-4o")
    assert result.final_answer == "x"  # the unpriced root model spends nothing


async def test_a_step_past_step_timeout_is_stopped_and_the_model_told(server, repl_kind):
    rlm = make_rlm(server, step_timeout=0.5, sandbox=repl_kind)
    server.script("root-model", [repl("print('started')\nwhile True:\n    pass"), "FINAL(ok)"])
    started = time.perf_counter()
    result = await rlm.arun("q", context="c")
    assert time.perf_counter() - started < 10  # (a wasm sandbox's start is in it)
    seen = result.trajectory[0].code[0].output
    assert "started" in seen and "longer than 0.5s and was stopped" in seen
    assert result.success


async def test_a_failing_root_model_fails_the_run_cleanly(server):
    rlm = make_rlm(server, max_retries=0)
    server.fail("401", model="root-model")
    result = await rlm.arun("q", context="c")
    assert not result.success and result.stop_reason == "error"
    assert "injected bad API key" in result.error


# -- isolation, concurrency, secrets --------------------------------------------------


@pytest.mark.parametrize("sandbox", SANDBOXES)
async def test_each_run_has_a_fresh_namespace(rlm, server, sandbox):
    server.script("root-model", [repl("seen = 1"), "FINAL(ok)"])
    await rlm.arun("q", context="c", sandbox=sandbox)
    server.script("root-model", [repl("print('seen' in dir())"), "FINAL(ok)"])
    again = await rlm.arun("q", context="c", sandbox=sandbox)
    assert again.trajectory[0].code[0].output == "False"


async def test_in_process_the_context_is_not_copied(rlm, server):
    big = "x" * 1_000_000
    server.script("root-model", [repl("print(id(context))"), "FINAL(ok)"])
    result = await rlm.arun("q", context=big, sandbox="none")
    assert result.trajectory[0].code[0].output == str(id(big))


async def test_concurrent_runs_on_one_rlm_do_not_mix_output_or_state(rlm, server, repl_kind):
    rlm.sandbox = repl_kind

    def root(body):
        turn = sum(1 for m in body["messages"] if m["role"] == "assistant")
        tag = body["messages"][1]["content"].split()[1]
        if turn == 0:
            return repl(
                f"mine = '{tag}'\nfor i in range(50):\n    print('{tag}', i)\n"
                "import time; time.sleep(0.001)"
            )
        return "FINAL_VAR(mine)"

    server.reply_with("root-model", root)
    results = await asyncio.gather(*(rlm.arun(f"run{i} q", context=i) for i in range(5)))
    for i, result in enumerate(results):
        assert result.final_answer == f"run{i}"
        lines = result.trajectory[0].code[0].output.splitlines()
        assert lines == [f"run{i} {n}" for n in range(50)]


async def test_secrets_never_reach_the_model(rlm, server, monkeypatch, repl_kind):
    rlm.sandbox = repl_kind
    monkeypatch.setenv("MY_SERVICE_TOKEN", "tok-very-secret-123")
    rlm.api_key = "sk-configured-key-456"
    context = "log line: auth tok-very-secret-123 and sk-configured-key-456 end"
    server.script("root-model", [repl("print(context)\nprint(llm_query(context))"), "FINAL(ok)"])
    result = await rlm.arun("q", context=context)
    sent = json.dumps(server.requests)
    assert "tok-very-secret-123" not in sent and "sk-configured-key-456" not in sent
    assert "[REDACTED]" in sent
    assert "tok-very-secret-123" not in json.dumps(result.to_dict())


# -- results -------------------------------------------------------------------------


async def test_result_is_json_safe_and_saves_as_jsonl(rlm, server, tmp_path):
    server.script("root-model", [repl("print(llm_query('x'))"), "FINAL(ok)"])
    result = await rlm.arun("q", context="c")
    data = json.loads(json.dumps(result.to_dict()))
    assert data["final_answer"] == "ok" and data["iterations"] == 2
    assert data["usage"]["total"]["calls"] == 3
    assert data["trajectory"][0]["sub_calls"] == 1
    path = result.save(tmp_path / "runs.jsonl")
    result.save(path)
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert [line["type"] for line in lines] == ["iteration", "iteration", "result"] * 2


async def test_result_text_is_short_and_html_shows_answer_and_code(rlm, server):
    server.script(
        "root-model", [repl("first_step = 6 * 7"), repl("second_step = 1"), "FINAL(forty-two)"]
    )
    result = await rlm.arun("q", context="c")
    assert repr(result) == "RLMResult(ok, iterations=3, sub-calls=0): forty-two"
    page = result._repr_html_()
    assert page.index("forty-two") < page.index("Trajectory")  # the answer comes first
    for name in ("first_step", "second_step"):  # each iteration's code, highlighted
        assert f"</span>{name} <span" in page
    assert "Iteration 3" in page and "<details>" in page
    assert result._repr_markdown_().startswith("forty-two")


def test_run_wraps_arun_outside_a_loop(server):
    rlm = make_rlm(server)
    server.script("root-model", ["FINAL(sync)"])
    assert rlm.run("q", context="c").final_answer == "sync"


def test_blocking_runs_leave_no_connections_open(server):
    def sockets() -> int:
        return sum(
            os.readlink(f"/proc/self/fd/{fd}").startswith("socket:")
            for fd in os.listdir("/proc/self/fd")
            if os.path.exists(f"/proc/self/fd/{fd}")
        )

    rlm = make_rlm(server, sandbox="none")
    rlm.run("warm-up", context="c")  # litellm's first import opens what it keeps
    before = sockets()
    for _ in range(5):  # each run is an asyncio.run of its own, with its own pools
        server.script(
            "root-model", [repl("x = llm_query_batch(['a', 'b', 'c', 'd'])"), "FINAL(done)"]
        )
        assert rlm.run("q", context="c").final_answer == "done"
    # (the in-process server closes its side of each connection a moment later)
    assert server.wait_for(lambda: sockets() <= before + 2, timeout=15)


async def test_run_inside_a_loop_says_to_await_arun(rlm):
    with pytest.raises(RuntimeError, match="await rlm.arun"):
        rlm.run("q")


def test_rlm_is_the_configurable_named_rlm():
    assert RLM.__name__ == "RLM" and isinstance(RLMResult(query="q"), RLMResult)


async def test_a_custom_system_prompt_replaces_the_built_in_one(server):
    rlm = make_rlm(server, system_prompt="Context is a {context_type}; keep {braces}.")
    server.script("root-model", ["FINAL(ok)"])
    await rlm.arun("q", context=[1, 2])
    assert root_requests(server)[0]["messages"][0]["content"] == "Context is a list; keep {braces}."


async def test_show_vars_lists_the_models_variables(rlm, server):
    server.script("root-model", [repl("total = 3\nnames = ['a']\nSHOW_VARS()"), "FINAL(ok)"])
    result = await rlm.arun("q", context="c")
    assert result.trajectory[0].code[0].output == "total: int\nnames: list"


# -- what the review found: stopped steps stay stopped, nothing is lost ------------------


async def test_a_stopped_step_sends_nothing_more_even_if_it_swallows_the_stop(server, repl_kind):
    rlm = make_rlm(server, step_timeout=0.5, sandbox=repl_kind)
    server.script(
        "root-model",
        [
            repl(
                "import time\nwhile True:\n    try:\n        time.sleep(0.05)\n"
                "        llm_query('zombie')\n    except:\n        pass"
            ),
            repl("x = 1"),
            "FINAL(ok)",
        ],
    )
    result = await rlm.arun("q", context="c")
    assert result.success
    sent = len(sub_requests(server))
    # Watch for a while: a step that survived its stop would keep calling.
    await asyncio.sleep(0.5)
    assert len(sub_requests(server)) == sent


async def test_the_models_variables_survive_a_failed_run(server, repl_kind):
    rlm = make_rlm(server, max_retries=0, sandbox=repl_kind)
    server.script("root-model", [repl("answers = llm_query_batch(['a', 'b'])")])
    server.fail("401", times=5, model="root-model", after=1)  # the second turn fails
    result = await rlm.arun("q", context="c")
    assert result.stop_reason == "error"
    assert result.variables["answers"] == ["echo: a", "echo: b"]
    assert result.to_dict()["variables"] == {"answers": "list"}


async def test_an_interrupted_step_keeps_its_output_in_the_trajectory(rlm, server, repl_kind):
    rlm.sandbox = repl_kind
    server.script(
        "root-model",
        [repl("print('before the wait')\nllm_query('started')\nimport time\ntime.sleep(30)")],
    )
    run = rlm.start("q", context="c")
    task = asyncio.ensure_future(run.execute())
    # The root turn and the step's sub-call are done: the step has printed.
    assert await asyncio.to_thread(server.wait_for, lambda: server.completed == 2)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert run.result.stop_reason == "interrupted"
    [block] = run.result.trajectory[0].code
    assert "before the wait" in block.output and block.error


async def test_gathering_a_list_of_helper_calls_runs_them_concurrently(rlm, server):
    server.model_latency = {"sub-model": 0.4}
    server.script(
        "root-model",
        [
            repl(
                "coros = [llm_query(f'q{i}') for i in range(8)]\n"
                "answers = await asyncio.gather(*coros)\nprint(answers[7])"
            ),
            "FINAL(ok)",
        ],
    )
    result = await rlm.arun("q", context="c")
    assert result.trajectory[0].code[0].output == "echo: q7"
    assert server.peak_in_flight == 8


async def test_model_code_cannot_reach_the_notebook_through_get_ipython(rlm, server):
    server.script("root-model", [repl("get_ipython()"), "FINAL(ok)"])
    result = await rlm.arun("q", context="c")
    assert "NameError: name 'get_ipython' is not defined" in result.trajectory[0].code[0].output


async def test_escaped_secrets_are_redacted_too(rlm, server, monkeypatch):
    secret = "pa'ss\\wo\"rd-99-é"
    monkeypatch.setenv("MY_PASSWORD", secret)
    server.script(
        "root-model",
        [
            repl("print(repr(context))\nimport json\nprint(json.dumps(context))\ncontext"),
            "FINAL(ok)",
        ],
    )
    await rlm.arun("q", context=secret)
    sent = json.dumps(server.requests, ensure_ascii=False)
    for spelling in (secret, repr(secret)[1:-1], json.dumps(secret)[1:-1]):
        assert json.dumps(spelling, ensure_ascii=False)[1:-1] not in sent


async def test_a_secret_at_the_cut_is_removed_whole(server, monkeypatch):
    token = "SECRETTOKEN" + "x" * 50
    monkeypatch.setenv("SERVICE_TOKEN", token)
    rlm = make_rlm(server, max_output_chars=30)
    # Spelled in pieces: a reply holding the token is redacted before its code runs.
    code = "print('a' * 25 + 'SECRET' + 'TOKEN' + 'x' * 50 + 'b' * 100)"
    server.script("root-model", [repl(code), "FINAL(ok)"])
    result = await rlm.arun("q", context="c")
    seen = result.trajectory[0].code[0].output
    assert seen.startswith("a" * 25 + "[REDACTED]\n... [output cut")
    assert "SE" not in seen.replace("[REDACTED]", "")


async def test_thread_pool_code_in_the_models_hands_works_concurrently(rlm, server, threaded_kind):
    rlm.sandbox = threaded_kind
    server.model_latency = {"sub-model": 0.3}
    server.script(
        "root-model",
        [
            repl(
                "import concurrent.futures\n"
                "with concurrent.futures.ThreadPoolExecutor(4) as pool:\n"
                "    futures = []\n"
                "    for i in range(4):\n"
                "        futures.append(pool.submit(lambda i=i: llm_query(f'q{i}')))\n"
                "    concurrent.futures.wait(futures)\n"
                "print([f.result() for f in futures])"
            ),
            "FINAL(ok)",
        ],
    )
    result = await rlm.arun("q", context="c")
    assert result.trajectory[0].code[0].output == str([f"echo: q{i}" for i in range(4)])
    assert server.peak_in_flight == 4


async def test_threads_the_model_started_stop_with_their_step(server, repl_kind):
    rlm = make_rlm(server, step_timeout=0.5, sandbox=repl_kind)
    server.model_latency = {"sub-model": 0.05}
    server.script(
        "root-model",
        [
            repl(
                "import concurrent.futures, time\n"
                "pool = concurrent.futures.ThreadPoolExecutor(2)\n"
                "jobs = [pool.submit(lambda: (time.sleep(0.1), llm_query('from step 1')))"
                " for _ in range(40)]\n"
                "pool.shutdown(wait=True)"
            ),
            repl("import time\ntime.sleep(1.5)"),
            "FINAL(ok)",
        ],
    )
    result = await rlm.arun("q", context="c")
    assert result.success
    from_step_one = [
        r for r in sub_requests(server) if r["messages"][-1]["content"] == "from step 1"
    ]
    # Step 1 ran for 0.5 s with 2 threads sleeping 0.1 s per call: about 10 calls, and
    # none once it was stopped (step 2 then blocks 0.5 s more: room for 10 more).
    assert len(from_step_one) <= 12, len(from_step_one)


async def test_a_thread_pool_made_in_one_step_serves_the_next(rlm, server, threaded_kind):
    rlm.sandbox = threaded_kind
    server.script(
        "root-model",
        [
            repl(
                "import concurrent.futures\npool = concurrent.futures.ThreadPoolExecutor(2)\n"
                "print(pool.submit(llm_query, 'one').result())"
            ),
            repl(
                "jobs = [pool.submit(lambda p: print(llm_query(p)), p) for p in ('two', 'three')]\n"
                "concurrent.futures.wait(jobs)\npool.shutdown()"
            ),
            "FINAL(ok)",
        ],
    )
    result = await rlm.arun("q", context="c")
    first, second = (it.code[0].output for it in result.trajectory[:2])
    assert first == "echo: one"
    assert sorted(second.splitlines()) == ["echo: three", "echo: two"]


async def test_a_budget_that_cannot_see_some_costs_says_so(server):
    rlm = make_rlm(server, max_cost_usd=1.0)  # root-model and sub-model have no price
    server.script("root-model", [repl("x = 1"), "FINAL(ok)"])
    with pytest.warns(RuntimeWarning, match="no price for openai/root-model"):
        result = await rlm.arun("q", context="c")
    assert result.success


async def test_threads_the_model_starts_print_to_the_model_not_the_cell(
    rlm, server, capsys, threaded_kind
):
    rlm.sandbox = threaded_kind
    server.script(
        "root-model",
        [
            repl(
                "import threading\n"
                "t = threading.Thread(target=lambda: print('from a thread'))\n"
                "t.start(); t.join()\n"
                "import concurrent.futures\n"
                "with concurrent.futures.ThreadPoolExecutor(2) as pool:\n"
                "    pool.submit(print, 'from a pool')"
            ),
            "FINAL(ok)",
        ],
    )
    result = await rlm.arun("q", context="c")
    assert result.trajectory[0].code[0].output == "from a thread\nfrom a pool"
    assert "from a" not in capsys.readouterr().out
