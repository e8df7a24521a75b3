"""The reply reader: which code runs and which answer is read, for the replies real
models write. Cases come from the issue, from the official RLM library's parsing tests
(current and legacy), from DSPy's fence tests and Hugging Face OpenEnv's repl_env tests,
and from real-model habits. Pure functions: fast."""

from __future__ import annotations

import pytest

from rlm_magic.rlm.replies import (
    ACCEPTED_FORMS,
    code_blocks,
    read_final_call,
    read_printed_final,
    read_reply,
    with_code_as_pointers,
)


def answer(text: str) -> str | None:
    final = read_reply(text).final
    return None if final is None else final.value


# -- the argument of FINAL( ends at the ')' that balances it -----------------------------


@pytest.mark.parametrize(
    "reply, expected",
    [
        # The wrong answers reported as successes.
        (
            "FINAL(The top three are:\n1. Apple (red)\n2. Banana (yellow)\n3. Cherry (dark red))",
            "The top three are:\n1. Apple (red)\n2. Banana (yellow)\n3. Cherry (dark red)",
        ),
        ("FINAL(42) is my answer.\nNote: (see above)", "42"),
        # Today's rule, kept for the cases it was written for.
        ("FINAL(The answer is 42)\n\nHope this helps (really).", "The answer is 42"),
        ("FINAL(42)\nHope this helps (really).", "42"),
        ("FINAL(it is f(x))", "it is f(x)"),
        ("FINAL(a) one\nb) two)", "a) one\nb) two"),
        ("FINAL(a) first b) second)", "a) first b) second"),
        ("FINAL(I'm sorry :( the data has no dates)", "I'm sorry :( the data has no dates"),
        # The official library's legacy parsing tests.
        ("The answer is:\nFINAL(42)", "42"),
        ("FINAL(This is a\nmultiline answer)", "This is a\nmultiline answer"),
        ("   FINAL(answer with spaces)", "answer with spaces"),
        ("FINAL(func(arg1, arg2))", "func(arg1, arg2)"),
        ("FINAL([1, 2, 3], (4, 5))", "[1, 2, 3], (4, 5)"),
        ("FINAL(calculate(10, 20) + process(data))", "calculate(10, 20) + process(data)"),
        (
            "FINAL({'key': 'value', 'nested': {'a': 1, 'b': 2}})",
            "{'key': 'value', 'nested': {'a': 1, 'b': 2}}",
        ),
        ("FINAL(123.45)", "123.45"),
        # Quotes around the whole answer are the model's, not the answer's.
        ('FINAL("Blue")', "Blue"),
        ("FINAL('hello world')", "hello world"),
        ('FINAL("""two\nlines""")', "two\nlines"),
        ("FINAL(`42`)", "42"),
        ('FINAL("a" and "b")', '"a" and "b"'),
    ],
)
def test_final_reads_up_to_its_balancing_parenthesis(reply, expected):
    assert answer(reply) == expected


@pytest.mark.parametrize(
    "reply, expected",
    [
        # The review's answers that were cut short and reported as read whole.
        (
            "FINAL(Findings:\n\n1) Revenue grew.\n\n2) Costs fell.)",
            "Findings:\n\n1) Revenue grew.\n\n2) Costs fell.",
        ),
        ("FINAL(Answer: a) yes\n\nb) no)", "Answer: a) yes\n\nb) no"),
        ("FINAL(Yes :) the data supports it)", "Yes :) the data supports it"),
        ("FINAL(Price rose 5%) and volume 3%)", "Price rose 5%) and volume 3%"),
        ('FINAL("He said :) hi")', "He said :) hi"),
        # More of the same kind.
        ("FINAL(1) Paris\n2) Lyon\n3) Nice)", "1) Paris\n2) Lyon\n3) Nice"),
        ("FINAL(1) Paris\n2) Lyon)\n\nThe top two (by population).", "1) Paris\n2) Lyon"),
        ("**FINAL(Answer: a) yes, b) no)**", "Answer: a) yes, b) no"),
        ("FINAL(i) the sum\nii) the mean)", "i) the sum\nii) the mean"),
        (
            "FINAL(Plan:\n1) Load\n   a) CSV\n   b) JSON\n2) Clean\n   a) dedupe)",
            "Plan:\n1) Load\n   a) CSV\n   b) JSON\n2) Clean\n   a) dedupe",
        ),
        ("FINAL(**Findings**\n\n**1)** up\n**2)** down)", "**Findings**\n\n**1)** up\n**2)** down"),
        ("FINAL(Yes ;-) it works)", "Yes ;-) it works"),
        ("FINAL(42) is my answer =)", "42"),
        ("FINAL(Ratio:(3/4) of rows)", "Ratio:(3/4) of rows"),
        ('FINAL(The key is "x)" in the log)', 'The key is "x)" in the log'),
        ("FINAL(The key is `f(x`)", "The key is `f(x`"),
        # ... while a marker-like ')' with nothing ordinary after it still closes.
        ("FINAL(Growth was 5%)", "Growth was 5%"),
        ("FINAL(42) Hope this helps :)", "42"),
        ("FINAL(7) is my answer, see step 2) above.", "7"),
        ("FINAL(3) apples (roughly).", "3"),
        ("FINAL(a)", "a"),
    ],
)
def test_list_markers_emoticons_and_quoted_parentheses_do_not_cut_the_answer(reply, expected):
    assert read_reply(reply).final.value == expected


def test_an_answer_ended_by_a_list_marker_is_not_balanced_so_a_cut_reply_is_refused():
    assert read_reply("FINAL(1) Paris\n2) Ly").final.balanced is False
    assert read_reply("FINAL(1) Paris\n2) Lyon)").final.balanced is True


@pytest.mark.parametrize(
    "reply, short, long",
    [
        ("FINAL(2) yes (see a) above) and more", "'2'", "'2) yes (see a) above'"),
        ("FINAL(a) Paris, b) Lyon) are both right", "'a'", "'a) Paris, b) Lyon'"),
        # Markers that do not count up as one list: a stray ')' ends neither reading surely.
        (
            "FINAL(10) is the count.\n\nSee notes a) and b).",
            "'10'",
            "'10) is the count. See notes a) and b'",
        ),
        ("FINAL(I think 7) is right)", "'I think 7'", "'I think 7) is right'"),
    ],
)
def test_an_answer_that_reads_two_ways_is_refused_with_both_readings(reply, short, long):
    reading = read_reply(reply)
    assert reading.final is None
    [problem] = reading.problems
    assert f"can be read two ways, as {short} or as {long}" in problem
    assert 'FINAL_VAR("variable_name")' in problem


@pytest.mark.parametrize("reply", ["FINAL()", "FINAL(  )", 'FINAL("")', "**FINAL(``)**"])
def test_an_empty_final_is_a_problem_not_an_answer(reply):
    reading = read_reply(reply)
    assert reading.final is None and "holds no answer" in reading.problems[0]


@pytest.mark.parametrize(
    "reply",
    [
        "FINAL(42).",
        "FINAL(42)!",
        "**FINAL(42)**",
        "__FINAL(42)__",
        "`FINAL(42)`",
        "> FINAL(42)",
        "- FINAL(42)",
        "## FINAL(42)",
        "FINAL(42) :)",
        "FINAL( 42 )",
        "I checked every row.\n\nFINAL(42)\n\nLet me know if you need more.",
        "```\nFINAL(42)\n```",
        "Done.\r\nFINAL(42)\r\n",
    ],
)
def test_common_spellings_of_a_final_answer_are_read(reply):
    assert answer(reply) == "42"


@pytest.mark.parametrize(
    "reply",
    [
        "The result is FINAL(42)",  # mid-sentence: the legacy library's rule too
        "I will call FINAL(x) later.",
        "```repl\nprint('FINAL(not this)')\n# FINAL(nor this)\n```",
        "```text\nFINAL(quoted output)\n```",
        '```json\n{"FINAL(x)": 1}\n```',
        "Still working on the problem...",
    ],
)
def test_final_outside_prose_or_mid_sentence_is_not_an_answer(reply):
    assert read_reply(reply).final is None


def test_the_first_readable_answer_wins():
    assert answer("FINAL(first)\nFINAL(second)") == "first"


def test_an_unclosed_final_before_a_second_one_does_not_swallow_it():
    reply = read_reply("FINAL(draft (unfinished\nFINAL(42)")
    assert reply.final.value == "42"
    assert "never closed" in reply.problems[0]


# -- FINAL_VAR names a variable ---------------------------------------------------------


@pytest.mark.parametrize(
    "reply, name",
    [
        ("Check the variable:\nFINAL_VAR(result)", "result"),
        ("FINAL_VAR('my_var')", "my_var"),
        ('FINAL_VAR("another_var")', "another_var"),
        ("FINAL_VAR(`total`).", "total"),
        ("**FINAL_VAR(answer_text)**", "answer_text"),
    ],
)
def test_final_var_reads_the_variables_name(reply, name):
    final = read_reply(reply).final
    assert (final.kind, final.value) == ("FINAL_VAR", name)


def test_final_var_with_no_name_is_a_problem_not_an_answer():
    reply = read_reply("FINAL_VAR(the answer)")
    assert reply.final is None
    assert "'the answer' is not a name" in reply.problems[0]


# -- an answer that cannot be read is said exactly ---------------------------------------


def test_a_final_cut_off_midway_is_no_answer_and_the_problem_quotes_it():
    reply = read_reply("FINAL(The top three are:\n1. Apple (red)\n2. Ban")
    assert reply.final is None
    [problem] = reply.problems
    assert problem.startswith(
        "Your FINAL( is never closed, so no answer was read from it: "
        "'FINAL(The top three are: 1. Apple (red) 2. Ban'"
    )
    assert ACCEPTED_FORMS in problem


def test_an_answer_the_line_rule_read_is_marked_so_a_cut_off_reply_can_refuse_it():
    assert read_reply("FINAL(Top three: Apple (red)").final.balanced is False
    assert read_reply("FINAL(Top three: Apple (red))").final.balanced is True


@pytest.mark.parametrize(
    "reply, seen",
    [
        ("The answer is FINAL(42)", "'The answer is FINAL(42)': it must begin a line"),
        ("FINAL answer: 42", "'FINAL answer: 42': it must begin a line"),
        ("```text\nFINAL(42)\n```", "inside a ```text block, where it is not read"),
    ],
)
def test_a_reply_that_names_final_but_gives_none_says_where(reply, seen):
    [problem] = read_reply(reply).problems
    assert seen in problem and ACCEPTED_FORMS in problem


def test_a_reply_with_code_is_not_scolded_for_mentioning_final():
    assert read_reply("```repl\nx = 1\n```\nThen I will call FINAL(x).").problems == []


# -- which code runs -----------------------------------------------------------------------


@pytest.mark.parametrize(
    "reply, blocks",
    [
        ("Here's some code:\n```repl\nx = 1 + 2\nprint(x)\n```\nDone.", ["x = 1 + 2\nprint(x)"]),
        ("```repl\na = 1\n```\nthen\n```repl\nb = 2\n```", ["a = 1", "b = 2"]),
        ("```python\nx = 3\n```\n```repl\ny = x * 2\n```", ["x = 3", "y = x * 2"]),
        ("```py\nx = 1\n```", ["x = 1"]),
        ("```Python3\nx = 1\n```", ["x = 1"]),
        ("``` repl\nx = 1\n```", ["x = 1"]),
        # DSPy's fence tests.
        ("```\nprint('no lang')\n```", ["print('no lang')"]),
        (
            "I'll inspect first.\n```python\nprint('hello')\n```\nThen I will submit.",
            ["print('hello')"],
        ),
        ("```python\nprint('oops')", ["print('oops')"]),  # unclosed at the end
        ("```\n```python\nprint(1)\n```\n```", ["print(1)"]),  # a decorative outer fence
        # Line endings and text glued to the closing fence.
        ("```repl\r\nx = 1\r\nprint(x)\r\n```\r\n", ["x = 1\nprint(x)"]),
        ("```repl\nx = 1\n```Now let me look at x.", ["x = 1"]),
        ("````python\ns = '```'\n````", ["s = '```'"]),
        # A fence inside a list item is indented; its code is not.
        (
            "1. First:\n   ```python\n   for i in range(2):\n       print(i)\n   ```",
            ["for i in range(2):\n    print(i)"],
        ),
        # Quotations and prose in bare fences do not run.
        ('```json\n{"a": 1}\n```', []),
        ("```text\nhello\n```", []),
        ("```\nThe answer is 42 (roughly)\n```", []),
        ("```\nFINAL(42)\n```", []),
        ("Just plain text without any code blocks.", []),
    ],
)
def test_code_blocks(reply, blocks):
    assert code_blocks(reply) == blocks


@pytest.mark.parametrize(
    "reply, runs, final",
    [
        ("```repl\nFINAL(The answer is 42)\n```", [], "The answer is 42"),  # not Python
        ("```repl\nFINAL(total)\n```", ["FINAL(total)"], None),  # Python: a call in code
        ("```\nFINAL(total)\n```", [], "total"),  # bare: the answer, as in prose
        ("```\nx = 6 * 7\nFINAL(x)\n```", ["x = 6 * 7\nFINAL(x)"], None),  # bare code
        ("```\nFINAL(x)\nprint(x)\n```", ["FINAL(x)\nprint(x)"], None),
    ],
)
def test_a_block_that_is_only_a_final_line(reply, runs, final):
    reading = read_reply(reply)
    assert reading.blocks == runs
    assert (reading.final.value if reading.final else None) == final


def test_text_after_a_closing_fence_is_read_for_the_answer():
    reply = read_reply("```repl\nx = 1\n```FINAL(42)")
    assert reply.blocks == ["x = 1"] and reply.final.value == "42"


def test_while_streaming_a_block_counts_only_once_its_closing_fence_arrived():
    text = "```repl\nx = 1\n```\n```repl\ny = 2\n"
    assert code_blocks(text, streaming=True) == ["x = 1"]
    assert code_blocks(text) == ["x = 1", "y = 2"]


def test_the_view_replaces_code_with_pointers_and_keeps_quotations():
    text = "Look:\n```repl\nx = 1\n```\n```json\n{}\n```\nFINAL(x)"
    assert with_code_as_pointers(text) == "Look:\n[code block 1 below]\n```json\n{}\n```\nFINAL(x)"


# -- a FINAL(...) line the model's own code printed (OpenEnv's convention) ------------------


@pytest.mark.parametrize(
    "printed, kind, value",
    [
        ("FINAL(42)\n", "FINAL", "42"),
        ("FINAL(The top three:\n1. Apple (red\n)", "FINAL", "The top three:\n1. Apple (red"),
        ("FINAL_VAR(my_answer)", "FINAL_VAR", "my_answer"),
        ("FINAL_VAR('my_answer')", "FINAL_VAR", "my_answer"),
        ("FINAL(42) (confidence 0.9)", "FINAL", "42"),
        (
            "FINAL(Top 3: A (red), B (blue)) - checked twice (ok)",
            "FINAL",
            "Top 3: A (red), B (blue)",
        ),
        ("FINAL(Findings:\n1) up\n2) down)\n", "FINAL", "Findings:\n1) up\n2) down"),
    ],
)
def test_a_printed_final_is_read_as_in_prose(printed, kind, value):
    final = read_printed_final(printed)
    assert (final.kind, final.value) == (kind, value)


@pytest.mark.parametrize(
    "printed", ["The answer: FINAL(42)", "FINAL(never closed", "FINAL()", "FINAL_VAR(two words)"]
)
def test_printed_text_that_gives_no_final_answer_is_not_an_answer(printed):
    assert read_printed_final(printed) is None


# -- a block that only calls FINAL, read without running it (the iteration limit's turn) ----


@pytest.mark.parametrize(
    "code, kind, value",
    [
        ("FINAL('Paris')", "FINAL", "Paris"),
        ("FINAL(42)", "FINAL", "42"),
        ("FINAL(summary)", "FINAL_VAR", "summary"),  # the variable's value, or no answer
        ("FINAL_VAR(summary)", "FINAL_VAR", "summary"),
        ("FINAL_VAR('summary')", "FINAL_VAR", "summary"),
    ],
)
def test_a_block_that_only_calls_final_is_read_as_its_answer(code, kind, value):
    final = read_final_call(code)
    assert (final.kind, final.value) == (kind, value)


@pytest.mark.parametrize("code", ["x = 1\nFINAL(x)", "print(FINAL(1))", "FINAL(", "FINAL()"])
def test_a_block_that_does_more_than_call_final_is_not_read(code):
    assert read_final_call(code) is None


@pytest.mark.parametrize(
    "code",
    [
        "FINAL(f'The total is {total}')",
        "FINAL(str(total))",
        "FINAL(a + b)",
        "FINAL(None)",
        "FINAL('')",
        "FINAL('  ')",
    ],
)
def test_a_final_call_whose_value_needs_running_or_is_empty_is_no_answer(code):
    assert read_final_call(code) is None
