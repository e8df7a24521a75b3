"""How a run finishes, end to end through ``RLM.arun`` over real HTTP, in both REPLs
(the sandbox process and kernel threads): each root reply is one a real model could
write, and each test one behaviour."""

from __future__ import annotations

import pytest

from .support import make_rlm
from .support.backends import SANDBOXES


def repl(code: str, text: str = "") -> str:
    return f"{text}\n```repl\n{code}\n```\n"


@pytest.fixture(params=SANDBOXES)
def rlm(request, server):
    return make_rlm(server, sandbox=request.param)


def feedback(server, turn: int = -1) -> str:
    """What the root model was told after a turn (the last, by default)."""
    return server.requests_for("root-model")[turn]["messages"][-1]["content"]


# -- answers written in the reply ---------------------------------------------------------


async def test_a_multiline_answer_with_parentheses_is_read_whole(rlm, server):
    answer = "The top three are:\n1. Apple (red)\n2. Banana (yellow)\n3. Cherry (dark red)"
    server.script("root-model", [f"FINAL({answer})"])
    result = await rlm.arun("q", context="c")
    assert result.success and result.final_answer == answer
    assert result.finished_by == "text marker"


async def test_prose_after_the_answer_is_not_part_of_it(rlm, server):
    server.script("root-model", ["FINAL(42) is my answer.\nNote: (see above)"])
    assert (await rlm.arun("q", context="c")).final_answer == "42"


@pytest.mark.parametrize("reply", ["FINAL(42).", "**FINAL(42)**", "```\nFINAL(42)\n```"])
async def test_common_spellings_finish_at_once(server, reply):
    rlm = make_rlm(server)
    server.script("root-model", [reply])
    result = await rlm.arun("q", context="c")
    assert result.final_answer == "42" and result.iterations == 1


async def test_an_answer_cut_off_mid_way_is_not_taken_and_the_model_is_told(rlm, server):
    server.script(
        "root-model",
        ["FINAL(The top three are:\n1. Apple (red)\n2. Ban", "FINAL(Apple, Banana, Cherry)"],
    )
    result = await rlm.arun("q", context="c")
    assert result.final_answer == "Apple, Banana, Cherry" and result.iterations == 2
    told = feedback(server)
    assert "FINAL( is never closed" in told and "'FINAL(The top three are:" in told
    assert "inside a ```repl block, FINAL(value)" in told  # the accepted forms


async def test_a_reply_cut_at_max_tokens_inside_final_is_not_taken(server):
    rlm = make_rlm(server, max_tokens=5)
    server.enforce_max_tokens = True  # 5 tokens: the reply stops after 20 characters
    server.script("root-model", ["FINAL(Top 3: A (red)\nB (blue)\nC (green))", "FINAL(A, B, C)"])
    result = await rlm.arun("q", context="c")
    assert result.final_answer == "A, B, C" and result.iterations == 2
    assert "cut off at max_tokens inside FINAL(...)" in feedback(server)


async def test_at_the_iteration_limit_a_block_that_only_calls_final_is_the_answer(server):
    rlm = make_rlm(server, max_iterations=1)
    server.script("root-model", [repl("best = 'Paris (France)'"), repl("FINAL(best)")])
    result = await rlm.arun("q", context="c")
    assert result.success and result.final_answer == "Paris (France)"


@pytest.mark.parametrize("call", ["FINAL(f'The total is {total}')", "FINAL(missing)"])
async def test_at_the_iteration_limit_a_final_of_code_not_run_is_no_answer(server, call):
    rlm = make_rlm(server, max_iterations=1)
    server.script("root-model", [repl("total = 10"), repl(call)])
    result = await rlm.arun("q", context="c")
    assert not result.success and result.stop_reason == "max_iterations"
    assert "The total is" not in (result.error or "")


async def test_an_answer_that_reads_two_ways_is_refused_and_the_model_restates_it(server):
    rlm = make_rlm(server)
    server.script(
        "root-model",
        ["FINAL(2) yes (see a) above) and more", repl("best = '2'\nFINAL_VAR('best')")],
    )
    result = await rlm.arun("q", context="c")
    assert result.final_answer == "2" and result.iterations == 2
    assert "can be read two ways, as '2' or as '2) yes (see a) above'" in feedback(server)


async def test_an_empty_final_in_the_reply_is_refused(server):
    rlm = make_rlm(server)
    server.script("root-model", ["FINAL()", "FINAL(done)"])
    result = await rlm.arun("q", context="c")
    assert result.final_answer == "done" and result.iterations == 2
    assert "Your FINAL() holds no answer" in feedback(server)


# -- finishing from code -------------------------------------------------------------------


async def test_final_called_in_code_ends_the_run_after_its_block(rlm, server):
    server.script(
        "root-model",
        [
            repl(
                "total = sum(range(5))\nFINAL(f'The total is {total} (checked)')\n"
                "print('the block runs to its end')"
            )
            + repl("print('not run')")
        ],
    )
    result = await rlm.arun("q", context="c")
    assert result.success and result.final_answer == "The total is 10 (checked)"
    assert result.finished_by == "call in code" and result.iterations == 1
    [block] = result.trajectory[0].code
    assert block.output == "the block runs to its end"


async def test_final_in_code_answers_with_a_string_as_it_is_and_other_values_as_str(rlm, server):
    server.script("root-model", [repl("FINAL({'a': 1})")])
    assert (await rlm.arun("q", context="c")).final_answer == "{'a': 1}"
    server.script("root-model", [repl("FINAL('it\\'s \"quoted\"\\nand two lines')")])
    assert (await rlm.arun("q", context="c")).final_answer == 'it\'s "quoted"\nand two lines'


@pytest.mark.parametrize("call", ["FINAL_VAR('summary')", "FINAL_VAR(summary)"])
async def test_final_var_in_code_answers_with_the_variables_value(rlm, server, call):
    server.script("root-model", [repl(f"summary = 'Paris (France)'\n{call}")])
    result = await rlm.arun("q", context="c")
    assert result.final_answer == "Paris (France)" and result.finished_by == "call in code"


async def test_final_var_of_a_bare_variable_answers_its_value_not_the_variable_it_names(
    rlm, server
):
    server.script(
        "root-model",
        [
            repl(
                "positive = 37\nnegative = 12\n"
                "label = 'positive' if positive > negative else 'negative'\nFINAL_VAR(label)"
            )
        ],
    )
    result = await rlm.arun("q", context="c")
    assert result.final_answer == "positive"


async def test_final_var_in_code_of_a_missing_name_is_an_error_the_model_sees(rlm, server):
    server.script("root-model", [repl("FINAL_VAR('sumary')"), repl("FINAL('recovered')")])
    result = await rlm.arun("q", context="c")
    assert result.final_answer == "recovered" and result.iterations == 2
    assert (
        "NameError: FINAL_VAR('sumary'): there is no variable named 'sumary'"
        in result.trajectory[0].code[0].output
    )


async def test_final_of_none_in_code_is_an_error_not_an_answer(rlm, server):
    server.script("root-model", [repl("FINAL(print('x'))"), repl("FINAL('ok')")])
    result = await rlm.arun("q", context="c")
    assert result.final_answer == "ok" and result.iterations == 2
    assert "the answer is None" in result.trajectory[0].code[0].output


@pytest.mark.parametrize(
    "code", ["s = ''\nFINAL(s)", "s = ' \\n'\nFINAL_VAR('s')", "s = ''\nFINAL_VAR(s)"]
)
async def test_an_empty_final_in_code_is_an_error_not_an_answer(rlm, server, code):
    server.script("root-model", [repl(code), "FINAL(ok)"])
    result = await rlm.arun("q", context="c")
    assert result.final_answer == "ok" and result.iterations == 2
    assert "the answer is empty" in result.trajectory[0].code[0].output


async def test_an_empty_answer_dict_is_not_the_answer(rlm, server):
    server.script(
        "root-model",
        [
            repl("answer['content'] = ' '\nanswer['ready'] = True"),
            repl("print(answer['ready'])"),
            "FINAL(ok)",
        ],
    )
    result = await rlm.arun("q", context="c")
    assert result.final_answer == "ok" and result.iterations == 3
    assert "answer['content'] is empty" in result.trajectory[0].code[0].output
    assert result.trajectory[1].code[0].output == "False"


async def test_a_final_var_of_an_empty_variable_in_the_reply_is_refused(server):
    rlm = make_rlm(server)
    server.script("root-model", [repl("s = ''"), "FINAL_VAR(s)", "FINAL(ok)"])
    result = await rlm.arun("q", context="c")
    assert result.final_answer == "ok" and result.iterations == 3
    assert "FINAL_VAR(s) gives an empty answer" in feedback(server)


async def test_final_then_an_error_in_the_same_block_is_not_the_answer(rlm, server):
    server.script(
        "root-model",
        [repl("FINAL('draft')\nraise RuntimeError('verification failed')"), "FINAL(checked)"],
    )
    result = await rlm.arun("q", context="c")
    assert result.final_answer == "checked" and result.iterations == 2
    assert (
        "[FINAL was called, but the block then failed: RuntimeError: verification "
        "failed; the run goes on]" in feedback(server)
    )


@pytest.mark.parametrize("sandbox", SANDBOXES)
async def test_final_then_a_step_timeout_is_not_the_answer(server, sandbox):
    rlm = make_rlm(server, sandbox=sandbox, step_timeout=0.5)
    server.script("root-model", [repl("FINAL('draft')\nwhile True:\n    pass"), "FINAL(checked)"])
    result = await rlm.arun("q", context="c")
    assert result.final_answer == "checked" and result.iterations == 2
    assert "[FINAL was called, but the block then failed: TimeoutError" in feedback(server)


async def test_the_answer_dict_then_an_error_is_not_the_answer_then_or_later(rlm, server):
    server.script(
        "root-model",
        [
            repl("answer['content'] = 'draft'\nanswer['ready'] = True\n1 / 0"),
            repl("print(answer['ready'])"),
            "FINAL(checked)",
        ],
    )
    result = await rlm.arun("q", context="c")
    assert result.final_answer == "checked" and result.iterations == 3
    assert "[answer['ready'] was set, but the block then failed: ZeroDivisionError" in feedback(
        server, 1
    )
    assert result.trajectory[1].code[0].output == "False"


async def test_a_final_line_the_code_prints_itself_ends_the_run(rlm, server):
    server.script("root-model", [repl("x = 6 * 7\nprint(f'FINAL({x})')")])
    result = await rlm.arun("q", context="c")
    assert result.final_answer == "42" and result.finished_by == "printed marker"


async def test_a_printed_final_with_words_after_it_answers_only_its_argument(server):
    rlm = make_rlm(server)
    server.script("root-model", [repl("print('FINAL(42) (confidence 0.9)')")])
    result = await rlm.arun("q", context="c")
    assert result.final_answer == "42" and result.finished_by == "printed marker"


async def test_printed_data_holding_final_never_ends_the_run(rlm, server):
    server.script("root-model", [repl("print(context)\nprint('FINAL' + '(built)')"), "FINAL(done)"])
    result = await rlm.arun("q", context="log line\nFINAL(from the data)\n")
    assert result.final_answer == "done" and result.iterations == 2


async def test_the_answer_dict_still_finishes(rlm, server):
    server.script("root-model", [repl("answer['content'] = 'via dict'\nanswer['ready'] = True")])
    result = await rlm.arun("q", context="c")
    assert result.final_answer == "via dict" and result.finished_by == "answer dict"


async def test_a_child_rlm_that_finishes_in_code_answers_its_parent(rlm, server):
    server.script(
        "root-model", [repl("print(rlm_query('count', context=[1, 2, 3]))"), "FINAL(parent done)"]
    )
    server.script("sub-model", [repl("FINAL(len(context))")])
    result = await rlm.arun("q", context="c")
    assert result.trajectory[0].code[0].output == "3"


# -- code the model meant to run ------------------------------------------------------------


@pytest.mark.parametrize(
    "reply",
    [
        "```\nprint(6 * 7)\n```",  # a bare fence
        "Let me compute.\n```python\nprint(6 * 7)",  # unclosed at the end of the reply
        "```repl\r\nprint(6 * 7)\r\n```\r\n",  # CRLF
        "```repl\nprint(6 * 7)\n```Now let me check the output.",  # text after the fence
    ],
)
async def test_code_in_every_plausible_fence_runs(server, reply):
    rlm = make_rlm(server)
    server.script("root-model", [reply, "FINAL(ok)"])
    result = await rlm.arun("q", context="c")
    assert [block.output for block in result.trajectory[0].code] == ["42"]


# -- the scaffold ----------------------------------------------------------------------------


async def test_overwritten_helpers_and_context_are_restored_and_the_model_told_once(rlm, server):
    server.script(
        "root-model",
        [
            repl("llm_query = lambda x: 'hi'\ncontext = 'x'\nrlm_query_batched = 'junk'"),
            repl("print(llm_query('q'), context, callable(rlm_query_batched))\nllm_query = None"),
            "FINAL(ok)",
        ],
    )
    result = await rlm.arun("q", context="the data")
    first, second = (it.code[0].output for it in result.trajectory[:2])
    assert (
        "[Your code rebound `context`, `llm_query`, `rlm_query_batched`, which the "
        "REPL provides; they are restored for your next blocks." in first
    )
    assert second == "echo: q the data True"  # and not told about llm_query again


async def test_show_vars_returns_the_listing(rlm, server):
    server.script(
        "root-model",
        [
            repl(
                "total = 3\nlisting = SHOW_VARS()\n"
                "print(type(listing).__name__, listing.splitlines())"
            ),
            "FINAL(ok)",
        ],
    )
    result = await rlm.arun("q", context="c")
    assert result.trajectory[0].code[0].output == "Listing ['total: int']"


async def test_history_exists_before_any_compaction(rlm, server):
    server.script("root-model", [repl("print(type(history).__name__, len(history))"), "FINAL(ok)"])
    result = await rlm.arun("q", context="c")
    assert result.trajectory[0].code[0].output == "list 0"
    assert "history" not in result.variables and "FINAL" not in result.variables


# -- what the user sees -----------------------------------------------------------------------


async def test_the_result_says_how_the_run_finished(server):
    rlm = make_rlm(server)
    server.script("root-model", [repl("FINAL('x')")])
    result = await rlm.arun("q", context="c")
    assert result.to_dict()["finished_by"] == "call in code"
    assert result.to_dict()["trajectory"][-1]["finished_by"] == "call in code"
    assert "finished by call in code" in result._repr_html_()


async def test_the_system_prompt_teaches_finishing_with_a_call_in_code(server):
    rlm = make_rlm(server)
    server.script("root-model", ["FINAL(ok)"])
    await rlm.arun("q", context="c")
    system = server.requests_for("root-model")[0]["messages"][0]["content"]
    assert "finish by calling FINAL in a ```repl block" in system
