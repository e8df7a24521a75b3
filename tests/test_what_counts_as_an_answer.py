"""What counts as an answer: error strings are not, a variable named in FINAL is read,
and answers cut off at max_tokens are visible. Over real HTTP to the local server."""

from __future__ import annotations

import traceback

import pytest

from rlm_magic import LLMQueryError

from .support import helpers, make_rlm


def repl(code: str) -> str:
    return f"```repl\n{code}\n```\n"


async def test_an_error_string_as_final_answer_is_not_success(server):
    server.fail("500", times=10, model="sub-model")
    rlm = make_rlm(server, max_retries=0)
    server.script("root-model", [repl("result = llm_query('hi')"), "FINAL_VAR(result)"])
    result = await rlm.arun("q", context="c")
    assert result.final_answer.startswith("Error: ")
    assert not result.success and result.stop_reason == "error"
    assert result.error.startswith("the final answer is an error message, not an answer: Error: ")


async def test_final_naming_a_repl_variable_answers_with_its_value(server):
    server.script("root-model", [repl("random_number = 42"), "FINAL(random_number)"])
    result = await make_rlm(server).arun("q", context="c")
    assert result.success and result.final_answer == "42"
    assert result.trajectory[-1].notes == [
        "FINAL(random_number) names a REPL variable: answered with its value, as FINAL_VAR would"
    ]
    assert "names a REPL variable" in result._repr_html_()


async def test_final_with_a_word_that_is_no_variable_stays_literal(server):
    server.script("root-model", [repl("x = 1"), "FINAL(Blue)"])
    result = await make_rlm(server).arun("q", context="c")
    assert result.final_answer == "Blue" and result.trajectory[-1].notes == []


async def test_answers_cut_at_max_tokens_are_counted_for_the_model_and_the_ledger(server):
    server.enforce_max_tokens = True
    server.reply_with("sub-model", lambda body: "word " * 400)  # ~500 tokens
    rlm = make_rlm(server, max_tokens=50)
    server.script(
        "root-model",
        [
            repl(
                "a = llm_query_batch(['one', 'two', 'three'])\nb = llm_query('four')\n"
                "print([len(x) for x in a], len(b))"
            ),
            "FINAL(done)",
        ],
    )
    result = await rlm.arun("q", context="c")
    seen = result.trajectory[0].code[0].output
    assert seen.startswith("[200, 200, 200] 200")  # the answers themselves are unchanged
    assert "[4 sub-call answers of this step are cut off (stopped at max_tokens" in seen
    assert result.trajectory[0].cut_answers == 4
    assert result.usage.by_model["openai/sub-model"].cut_off == 4
    assert "cut off" in repr(result.usage)


async def test_whole_answers_are_not_counted_as_cut(server):
    server.enforce_max_tokens = True
    rlm = make_rlm(server, max_tokens=50)
    server.script("root-model", [repl("print(llm_query('short'))"), "FINAL(done)"])
    result = await rlm.arun("q", context="c")
    assert "cut off" not in result.trajectory[0].code[0].output
    assert result.usage.total.cut_off == 0


# -- cut answers in the response cache ------------------------------------------------------


async def test_an_answer_cut_at_max_tokens_comes_from_the_cache_cut_off(server, tmp_path):
    server.enforce_max_tokens = True
    server.reply_with("sub-model", lambda body: "word " * 400)
    rlm = make_rlm(server, max_tokens=50, cache=True, cache_dir=str(tmp_path))
    ask = [{"role": "user", "content": "long"}]
    first = await rlm.client.complete(ask)
    again = await rlm.client.complete(ask)
    assert again.cached and again.text == first.text
    assert first.cut_off and again.cut_off and again.incomplete


async def test_an_answer_cut_at_a_max_tokens_lowered_to_fit_is_not_cached(server, tmp_path):
    server.enforce_max_tokens = True
    server.reply_with("sub-model", lambda body: "word " * 2000)
    # ~3,500 prompt tokens on a 4,096-token window: sent with far less than max_tokens.
    rlm = make_rlm(server, context_window=4096, cache=True, cache_dir=str(tmp_path))
    ask = [{"role": "user", "content": "word " * 2800}]
    first = await rlm.client.complete(ask)
    assert first.cut_off and server.requests[-1]["max_tokens"] < rlm.max_tokens
    again = await rlm.client.complete(ask)
    assert not again.cached and len(server.requests_for("sub-model")) == 2


@pytest.mark.parametrize("wire", [True, False])  # aiohttp straight, or litellm
async def test_a_key_quoted_in_a_providers_error_reaches_no_error_text(server, wire):
    key = "sk-echoed-0123456789abcdef"  # what the server's "401-echo" quotes
    server.fail("401-echo", times=5, model="sub-model")
    rlm = make_rlm(server, api_key=key, wire_transport=wire)
    server.script("root-model", [repl("r = llm_query('hi')\nprint(r)"), "FINAL(done)"])
    result = await rlm.arun("q", context="c")
    seen = result.trajectory[0].code[0].output
    assert seen.startswith("Error: ") and "Bearer [REDACTED]" in seen
    errors = [r.error for r in rlm.client.ledger.records if r.error]
    assert errors and not any(key in e for e in errors)
    with pytest.raises(LLMQueryError) as raised:
        await helpers(rlm).llm_query("again")
    shown = "".join(traceback.format_exception(raised.value))  # causes included
    assert "Bearer [REDACTED]" in shown and key not in shown
