"""An answer that says nothing (empty, or a label whose value is empty, as code builds it
from data that matched nothing: ``'Most "timeout" lines by service: '``) is not taken:
the model is told and may say in words that nothing was found; a run that ends without
another answer is not reported as answered, and says which answer said nothing."""

from __future__ import annotations

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from rlm_magic.rlm.finishing.empty import says_nothing

from .support import last_feedback, make_rlm, repl

EMPTY = [
    "",
    "[]",
    "{}",
    "()",
    "None",
    "null",
    "nan",
    "NaN",
    "''",
    '""',
    "set()",
    "Counter()",
    "[[], {}]",
    "{'auth': []}",
    "[None, '']",
    "Counter({})",
    "n/a",
    "undefined",
]
SEPARATORS = [": ", ":", " = ", "=", ":\t", " — none: "]
# A label: words, quotes, parentheses; no brackets or separators of its own.
labels = st.text(
    st.characters(
        codec="utf-8", exclude_characters="[]{}():=,;|\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029"
    ),
    max_size=40,
)
punctuation = st.sampled_from(["", " ", ".", " .", "  \n", "**", "`"])


@settings(max_examples=300, deadline=None)
@given(labels, st.sampled_from(SEPARATORS), st.sampled_from(EMPTY), punctuation)
@example('Most "timeout" lines by service', ": ", "", "")
def test_a_label_with_an_empty_value_says_nothing(label, separator, empty, end):
    assert says_nothing(f"{label}{separator}{empty}{end}")
    assert says_nothing(f"{label}{separator}{empty}{end}\n\n{label}{separator}{empty}")


# Values that say something: a number (0 is a count), a word, a container holding one.
saying = st.one_of(
    st.integers().map(str),
    st.sampled_from(["auth", "False", "True", "no service", "none found", "checkout: 3"]),
    st.integers().map(lambda n: f"[{n}]"),
    st.integers().map(lambda n: f"{{'auth': {n}}}"),
    st.integers().map(lambda n: f"Counter({{'auth': {n}}})"),
)


@settings(max_examples=300, deadline=None)
@given(labels, st.sampled_from(SEPARATORS), saying, st.sampled_from(EMPTY))
def test_a_value_that_says_something_makes_the_answer_say_something(label, separator, value, empty):
    assert not says_nothing(f"{label}{separator}{value}")
    assert not says_nothing(f"{label}{separator}{empty}, other{separator}{value}")
    assert not says_nothing(f"{label}{separator}{empty}\n{label}{separator}{value}")


@pytest.mark.parametrize(
    "answer",
    ['No line contains "timeout".', "0", "Time: 12:00", "None of them", "X: [] (3 failed)"],
)
def test_plain_answers_say_something(answer):
    assert not says_nothing(answer)


def test_a_long_answer_is_not_read():
    assert not says_nothing("x: " + " " * 20_000)


@pytest.mark.parametrize(
    "giving",
    [
        repl("result = 'Most \"timeout\" lines by service: ' + ', '.join([])")
        + "FINAL_VAR(result)",
        repl("FINAL('Counts: []')"),
        repl("print('FINAL(Counts: {})')"),
        "FINAL(Counts: None)",
    ],
    ids=["final-var", "call-in-code", "printed", "text"],
)
async def test_an_answer_that_says_nothing_is_refused_and_words_are_taken(server, giving):
    rlm = make_rlm(server)
    server.script("root-model", [giving, "FINAL(No service has a timeout line.)"])
    result = await rlm.arun("Which service has the most timeouts?", context="c")
    assert result.success and result.final_answer == "No service has a timeout line."
    told = server.requests_for("root-model")[1]["messages"][-1]["content"]
    assert "says nothing" in told and "say so in words" in told
    assert any("says nothing" in note for note in result.trajectory[0].notes)


async def test_a_run_left_with_an_answer_that_says_nothing_is_not_answered(server):
    rlm = make_rlm(server, max_iterations=1)
    nothing = repl("result = 'Most \"timeout\" lines by service: '") + "FINAL_VAR(result)"
    server.script("root-model", [nothing, "FINAL_VAR(result)"])
    result = await rlm.arun("Which service has the most timeouts?", context="c")
    # Its last turn (past the limit) said nothing again: the run ends on that, unanswered.
    assert not result.success and result.stop_reason == "empty_answer"
    assert any("says nothing" in note for note in result.trajectory[0].notes)
    line = "No answer: in iteration 1, FINAL_VAR(result) says nothing"
    assert line in result._repr_markdown_()
    page = result._repr_html_()
    assert line in page and "#b26a00" in page and "rlm-failed" in page
    assert "answered" not in result._repr_markdown_().splitlines()[-1]


@pytest.mark.parametrize(
    "again",
    [
        "FINAL(None)",
        repl("FINAL('Counts: []')"),
        repl("result = 'Most \"timeout\" lines by service: '") + "FINAL_VAR(result)",
    ],
    ids=["text", "call-in-code", "final-var"],
)
async def test_an_answer_that_says_nothing_given_again_after_being_told_ends_the_run(server, again):
    rlm = make_rlm(server, max_iterations=30)
    server.script("root-model", ["FINAL(Counts: {})", again, "FINAL(never asked)"])
    result = await rlm.arun("Which service has the most timeouts?", context="c")
    assert result.iterations == 2 and len(server.requests_for("root-model")) == 2
    assert not result.success and result.stop_reason == "empty_answer"
    assert "says nothing" in result.error and result.final_answer.strip()
    assert "Another answer that says nothing ends the run" in last_feedback(server)
    assert "answered" not in result._repr_markdown_().splitlines()[-1]
