"""An answer is final only if the model saw what its code printed: a literal answer is
taken only from a reply that runs no other code before it. End to end through
``RLM.arun`` over real HTTP, in both REPLs, streamed with early execution, streamed
without it, and unstreamed; each root reply one a real model writes (Claude 4.6 writes
what it expects a block to print, then FINAL, in one reply)."""

from __future__ import annotations

import pytest

from rlm_magic.rlm.result import Withheld

from .support import make_rlm

CONTEXT = "line\n" * 20  # 20 lines: a model that guesses says 7


def repl(code: str, text: str = "") -> str:
    return f"{text}\n```repl\n{code}\n```\n"


COUNT = repl("n = context.count('\\n')\nprint(n)", "I'll count the lines.")


@pytest.fixture(
    params=[
        ("process", True, True),
        ("none", True, True),
        ("none", True, False),
        ("none", False, False),
        ("process", False, False),
    ],
    ids=lambda p: f"{p[0]}-{'stream' if p[1] else 'whole'}-{'early' if p[2] else 'late'}",
)
def rlm(request, server):
    sandbox, stream, early = request.param
    return make_rlm(server, sandbox=sandbox, stream=stream, early_execution=early)


def told(server, turn: int = 1) -> str:
    """What the root model was sent as the last message before turn ``turn`` (from 0)."""
    return server.requests_for("root-model")[turn]["messages"][-1]["content"]


def kept_reply(server, turn: int = 1) -> str:
    """The model's previous reply as the conversation holds it before turn ``turn``."""
    return server.requests_for("root-model")[turn]["messages"][-2]["content"]


# -- literal answers after code are withheld -------------------------------------------------


async def test_a_text_final_after_a_block_is_not_taken_and_the_block_runs(rlm, server):
    server.script("root-model", [COUNT + "So there are 7 lines.\nFINAL(7)", "FINAL(20)"])
    result = await rlm.arun("How many lines?", context=CONTEXT)
    assert result.final_answer == "20" and result.iterations == 2
    assert result.trajectory[0].code[0].output == "20"
    assert "Output of block 1:\n20" in told(server)


async def test_a_printed_final_after_other_code_is_not_taken(rlm, server):
    server.script(
        "root-model",
        [repl("n = context.count('\\n')\nprint(n)\nprint('FINAL(7)')"), "FINAL(20)"],
    )
    result = await rlm.arun("How many lines?", context=CONTEXT)
    assert result.final_answer == "20" and result.iterations == 2


async def test_an_answer_dict_filled_with_a_literal_after_a_block_is_not_taken(rlm, server):
    server.script(
        "root-model",
        [COUNT + repl("answer['content'] = '7'\nanswer['ready'] = True"), "FINAL(20)"],
    )
    result = await rlm.arun("How many lines?", context=CONTEXT)
    assert result.final_answer == "20" and result.iterations == 2


async def test_a_literal_final_call_after_other_statements_is_not_taken(rlm, server):
    server.script("root-model", [repl("n = context.count('\\n')\nFINAL('7')"), "FINAL(20)"])
    result = await rlm.arun("How many lines?", context=CONTEXT)
    assert result.final_answer == "20" and result.iterations == 2


async def test_the_model_is_told_in_one_line_and_its_repeated_answer_finishes(rlm, server):
    server.script("root-model", [COUNT + "There are 7 lines.\nFINAL(7)", "FINAL(20)"])
    result = await rlm.arun("How many lines?", context=CONTEXT)
    [line] = [line for line in told(server).splitlines() if "FINAL(7)" in line]
    assert line == (
        "[Your answer FINAL(7) was written before you saw the output above, so it was "
        "not taken; if it stands, give it again.]"
    )
    assert result.success and result.finished_by == "text marker"


@pytest.mark.parametrize(
    "block",
    [
        'final_answer = "There are 7 lines."\nFINAL(final_answer)',
        'answer.update({"content": "There are 7 lines.", "ready": True})',
        'answer |= {"content": "There are 7 lines.", "ready": True}',
        'answer["content"], answer["ready"] = "There are 7 lines.", True',
        'FINAL("""\nThere are 7 lines.\n""".strip())',
        "FINAL(str(7))",
    ],
    ids=["variable", "update", "merge", "tuple", "strip", "str-of-number"],
)
async def test_a_literal_given_another_way_after_a_block_is_not_taken(rlm, server, block):
    server.script("root-model", [COUNT + repl(block), "FINAL(20)"])
    result = await rlm.arun("How many lines?", context=CONTEXT)
    assert result.final_answer == "20" and result.iterations == 2


async def test_a_text_final_var_of_a_literal_after_a_printing_block_is_not_taken(rlm, server):
    server.script(
        "root-model",
        [COUNT + repl("result = 'There are 7 lines.'") + "FINAL_VAR(result)", "FINAL(20)"],
    )
    result = await rlm.arun("How many lines?", context=CONTEXT)
    assert result.final_answer == "20" and result.iterations == 2


# -- answers the code gives stay final ----------------------------------------------------------


@pytest.mark.parametrize(
    "reply",
    [
        repl("n = context.count('\\n')") + "FINAL_VAR(n)",
        repl("n = context.count('\\n')") + "FINAL(n)",  # a REPL variable: read as FINAL_VAR
        COUNT + repl("FINAL_VAR('n')"),
        COUNT + repl("FINAL(f'{n}')"),
        COUNT + repl("print(f'FINAL({n})')"),
    ],
    ids=["text-final-var", "text-final-of-a-variable", "code-final-var", "code-final", "print"],
)
async def test_an_answer_the_code_computed_finishes_the_reply(rlm, server, reply):
    server.script("root-model", [reply])
    result = await rlm.arun("How many lines?", context=CONTEXT)
    assert result.final_answer == "20" and result.iterations == 1


@pytest.mark.parametrize(
    "reply",
    [
        "FINAL(42)",
        repl("FINAL('42')", "I know this one."),
        repl("print('FINAL(42)')"),
        repl("answer['content'] = '42'\nanswer['ready'] = True"),
        repl('summary = """42"""\nFINAL(summary)', "Here is the answer."),
        repl("import json\nFINAL('42')"),
        repl('"""The answer."""\nFINAL("42")'),
    ],
    ids=["text", "call", "print", "answer-dict", "a-literal-variable", "import", "docstring"],
)
async def test_a_lone_literal_answer_still_finishes_at_once(rlm, server, reply):
    server.script("root-model", [reply])
    result = await rlm.arun("q", context=CONTEXT)
    assert result.final_answer == "42" and result.iterations == 1


async def test_a_text_final_var_after_a_failed_block_is_not_taken(rlm, server):
    server.script(
        "root-model",
        [repl("n = len(context.splitlines())\nraise ValueError('bad line')") + "FINAL_VAR(n)"]
        + ["FINAL(20)"],
    )
    result = await rlm.arun("How many lines?", context=CONTEXT)
    assert result.final_answer == "20" and result.iterations == 2
    assert "a block of that reply failed" in told(server)


# -- what the model wrote as the output ----------------------------------------------------------

GUESSED = COUNT + "Output:\n```\n7\n```\nSo there are 7 lines.\nFINAL(7)"


async def test_the_conversation_holds_the_real_output_not_the_guessed_one(rlm, server):
    server.script("root-model", [GUESSED, "FINAL(20)"])
    await rlm.arun("How many lines?", context=CONTEXT)
    kept = kept_reply(server)
    assert kept.startswith(COUNT.rstrip()) and "Output:" not in kept and "7" not in kept
    assert kept.endswith(
        "[The rest of this reply was left out: it was written before the output of the "
        "code above was seen.]"
    )
    assert "Output of block 1:\n20" in told(server)


async def test_a_guessed_output_fence_is_not_run_as_code(rlm, server):
    server.script("root-model", [GUESSED, "FINAL(20)"])
    result = await rlm.arun("How many lines?", context=CONTEXT)
    assert [block.code for block in result.trajectory[0].code] == [
        "n = context.count('\\n')\nprint(n)"
    ]


async def test_a_block_written_after_a_guessed_output_is_not_run(rlm, server):
    server.script(
        "root-model",
        [COUNT + "Output:\n```\n7\n```\nNow the average:\n" + repl("print(140 / 7)"), "FINAL(7)"],
    )
    result = await rlm.arun("q", context=CONTEXT)
    assert len(result.trajectory[0].code) == 1


async def test_an_output_heading_followed_by_a_block_is_not_taken_for_a_guess(rlm, server):
    reply = COUNT + "Results:\n" + repl("double = 2 * n\nprint(double)") + "FINAL_VAR(double)"
    server.script("root-model", [reply])
    result = await rlm.arun("q", context=CONTEXT)
    assert result.final_answer == "40" and result.iterations == 1


async def test_the_trajectory_records_what_was_withheld(rlm, server):
    server.script("root-model", [COUNT + "There are 7 lines.\nFINAL(7)", "FINAL(20)"])
    result = await rlm.arun("How many lines?", context=CONTEXT)
    assert result.trajectory[0].withheld == [Withheld("FINAL(7)", "unseen output")]
    assert result.to_dict()["trajectory"][0]["withheld"] == [
        {"what": "FINAL(7)", "why": "unseen output"}
    ]
    assert "Not taken (unseen output): FINAL(7)" in result._repr_html_()


async def test_the_trajectory_records_a_guess_left_out(server):
    rlm = make_rlm(server, stream=False)
    server.script("root-model", [GUESSED, "FINAL(20)"])
    result = await rlm.arun("How many lines?", context=CONTEXT)
    assert result.trajectory[0].withheld == [
        Withheld("Output:", "guessed output"),
        Withheld("FINAL(7)", "unseen output"),
    ]


# -- a streamed turn stops at the guess ------------------------------------------------------------


@pytest.mark.parametrize("early", [True, False])
async def test_a_streamed_turn_is_stopped_where_it_begins_to_guess_the_output(server, early):
    rlm = make_rlm(server, early_execution=early)
    server.token_delay = 0.01  # the guess is still being written when the turn is read
    server.script("root-model", [GUESSED + "\n" + "More guessed text. " * 50, "FINAL(20)"])
    result = await rlm.arun("How many lines?", context=CONTEXT)
    assert result.final_answer == "20" and server.cancelled == 1
    assert "guessed text" not in result.trajectory[0].response
    assert result.usage.total.cancelled == 1 and result.usage.total.errors == 0


async def test_a_second_block_and_a_final_var_right_after_a_block_are_never_cut(server):
    rlm = make_rlm(server)
    server.token_delay = 0.005
    reply = (
        COUNT + "\n\nNow double it:\n" + repl("double = 2 * n\nprint(double)") + "FINAL_VAR(double)"
    )
    server.script("root-model", [reply])
    result = await rlm.arun("q", context=CONTEXT)
    assert result.final_answer == "40" and server.cancelled == 0
    assert [block.output for block in result.trajectory[0].code] == ["20", "40"]


# -- by origin, whatever the spelling ---------------------------------------------------
# (tests/test_answer_origin_decides_the_finish.py generates the class)
@pytest.mark.parametrize(
    "finish",
    [
        'FINAL(f"{7} lines")',
        "FINAL(3 + 4)",
        'FINAL("{} lines".format(7))',
        'FINAL("There are %d lines" % 7)',
        'FINAL(" ".join(["7", "lines"]))',
        "answer.update(content=str(7), ready=True)",
        'print(f"FINAL({7} lines)")',
    ],
)
async def test_an_answer_typed_in_any_spelling_after_unseen_output_is_not_taken(
    rlm, server, finish
):
    server.script("root-model", [repl(f"print(context.count('\\n'))\n{finish}"), "FINAL(20)"])
    result = await rlm.arun("How many lines?", context=CONTEXT)
    assert result.final_answer == "20" and result.iterations == 2
    assert result.trajectory[0].withheld[0].why == "unseen output"


@pytest.mark.parametrize(
    "finish",
    [
        "print(FINAL(v))",
        "FINAL(v)",
        "FINAL_VAR('v')",
        "answer['content'] = v\nanswer['ready'] = True",
    ],
)
async def test_a_reply_that_only_writes_its_answer_down_finishes_in_its_turn(rlm, server, finish):
    server.script("root-model", [repl(f"v = '42'\n{finish}")])
    result = await rlm.arun("What is the answer?", context=CONTEXT)
    assert result.success and result.final_answer == "42" and result.iterations == 1


async def test_an_answer_computed_in_any_spelling_is_taken_in_its_turn(rlm, server):
    code = "n = context.count('\\n')\nprint(n)\nFINAL(f'There are {n} lines')"
    server.script("root-model", [repl(code)])
    result = await rlm.arun("How many lines?", context=CONTEXT)
    assert result.final_answer == "There are 20 lines" and result.iterations == 1


async def test_an_answer_given_again_after_its_output_was_seen_is_taken(rlm, server):
    again = repl("print(context.count('\\n'))\nFINAL('7')")
    server.script("root-model", [again, again])
    result = await rlm.arun("How many lines?", context=CONTEXT)
    assert result.final_answer == "7" and result.iterations == 2
    assert result.trajectory[0].withheld and not result.trajectory[1].withheld
