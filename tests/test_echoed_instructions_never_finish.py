"""A model that echoes its own instructions never finishes with their words: the
placeholder (``FINAL(answer)``), the REPL's unset ``answer`` dict, or a sentence of the
prompts. End to end through ``RLM.arun`` over real HTTP, in both REPLs, and the rule
alone over generated instruction sentences."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rlm_magic.rlm.finishing.echoes import Echoes
from rlm_magic.rlm.prompts import CONTINUE_PROMPT, ITERATION_LIMIT_PROMPT, SYSTEM_PROMPT
from rlm_magic.rlm.replies import ACCEPTED_FORMS

from .support import make_rlm
from .support.backends import SANDBOXES

INSTRUCTIONS = [SYSTEM_PROMPT, CONTINUE_PROMPT, ITERATION_LIMIT_PROMPT, ACCEPTED_FORMS]


def repl(code: str, text: str = "") -> str:
    return f"{text}\n```repl\n{code}\n```\n"


@pytest.fixture(params=SANDBOXES)
def rlm(request, server):
    return make_rlm(server, sandbox=request.param, max_iterations=3)


@pytest.mark.parametrize(
    "echo",
    [
        "FINAL(answer)",
        "FINAL(your answer)",
        "**FINAL(Answer)**",
        "FINAL_VAR(variable_name)",
        repl("FINAL(answer)"),
        repl("print(FINAL(answer))"),
        repl('print("FINAL(answer)")'),
        repl("answer['ready'] = True"),
        "FINAL(Give your best final answer now, on its own line)",
        repl("FINAL('Write ```repl code to make progress')"),
    ],
)
async def test_a_model_that_echoes_its_prompts_never_finishes_with_their_words(rlm, server, echo):
    server.script("root-model", [echo] * 5)
    result = await rlm.arun("Which service timed out most?", context="checkout timeout\n" * 5)
    assert not result.success and result.stop_reason == "max_iterations"
    told = server.requests_for("root-model")[1]["messages"][-1]["content"]
    assert any(why in told for why in ("not an answer", "is empty", "no variable named"))


async def test_the_echo_is_told_and_a_real_answer_after_it_is_taken(rlm, server):
    server.script("root-model", ["FINAL(answer)", "FINAL(checkout)"])
    result = await rlm.arun("Which service timed out most?", context="checkout timeout\n")
    assert result.success and result.final_answer == "checkout" and result.iterations == 2
    assert (
        "the placeholder of the instructions"
        in (server.requests_for("root-model")[1]["messages"][-1]["content"])
    )


async def test_a_placeholder_the_question_itself_asks_about_is_an_answer(rlm, server):
    server.script("root-model", ["FINAL(value)"])
    result = await rlm.arun("Which column holds the value?", context="name,value\n")
    assert result.success and result.final_answer == "value"


# -- the rule alone -----------------------------------------------------------------------
ECHOES = Echoes(INSTRUCTIONS)
SENTENCES = [
    sentence.strip()
    for text in INSTRUCTIONS
    for sentence in text.replace("\n", " ").split(". ")
    if len(sentence.strip()) >= 40 and "{" not in sentence
]


@settings(max_examples=200, deadline=None)
@given(st.sampled_from(SENTENCES), st.data())
def test_any_stretch_of_the_instructions_is_not_an_answer(sentence, data):
    start = data.draw(st.integers(0, len(sentence) - 30))
    end = data.draw(st.integers(start + 30, len(sentence)))
    assert ECHOES.problem(sentence[start:end], "FINAL(x)") is not None


@settings(max_examples=200, deadline=None)
@given(st.text(min_size=1, max_size=200).filter(lambda t: t.strip() and "'content'" not in t))
def test_answers_that_are_not_the_instructions_words_pass(answer):
    normal = " ".join(answer.split()).casefold().strip("`'\"*_.:")
    if normal in ECHOES.placeholders or (
        len(normal) >= 24 and any(normal in text for text in ECHOES.texts)
    ):
        return  # generated text that happens to be the instructions' own
    assert ECHOES.problem(answer, "FINAL(x)") is None


def test_the_unset_answer_dict_in_any_quoting_is_not_an_answer():
    for text in ["{'content': '', 'ready': False}", "{'content': \"it's\", 'ready': False}"]:
        assert "`answer` dict" in ECHOES.problem(text, "FINAL(answer)")


async def test_a_word_the_code_took_from_the_data_is_an_answer_even_if_a_placeholder(rlm, server):
    server.script("root-model", [repl("col = context.split(',')[1].strip()\nFINAL(col)")])
    result = await rlm.arun("Which column holds prices?", context="name, value\n")
    assert result.success and result.final_answer == "value"
