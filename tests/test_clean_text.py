"""Model text is shown, never obeyed.

A model's answer, the turn it streams, its code's output and errors quoting them reach
terminals (terminal IPython, ``jupyter console``) and notebooks. In them, the control
characters a terminal acts on (escape sequences: a clipboard write, a disguised link, a
screen clear, cursor moves; a lone carriage return or backspace; bidi overrides) are
made visible, and the Markdown view carries no HTML; ``result.answer`` stays the model's
exact text. Here: the cleaning itself, the result's views, the errors and the terminal
status line, and what a real kernel sends its client. (Terminal IPython and jupyter
console, typed into for real: tests/test_terminal_clients.py.)
"""

from __future__ import annotations

import io
import re
import time
from types import SimpleNamespace

import pytest

from rlm_magic import RLMRunError
from rlm_magic._terminal_text import one_line, visible
from rlm_magic.jupyter.progress import RunStatus, TextLine
from rlm_magic.rlm.render import markdown_without_html
from rlm_magic.rlm.result import RLMResult

from .support import make_rlm
from .support.hostile_text import (
    ATTACKS,
    FAILING_RUN,
    HOSTILE,
    HOSTILE_RUN,
    STREAMED,
    raw_sequences,
)


# -- the cleaning ------------------------------------------------------------------
@pytest.mark.parametrize("name", ATTACKS)
def test_no_control_a_terminal_acts_on_survives(name):
    text, raw = ATTACKS[name]
    shown = visible(text)
    assert raw not in shown
    assert not re.search("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]", shown)


def test_controls_are_shown_as_pictures_or_escapes():
    assert visible("\x1b[2J") == "␛[2J"
    assert visible("a\rb\x08c\x07\x00\x7f") == "a␍b␈c␇␀␡"
    assert visible("\x9b2J") == "\\x9b2J"  # C1 controls and bidi have no picture
    assert visible("\u202eevil\u202c") == "\\u202eevil\\u202c"
    assert visible("\u2066x\u2069") == "\\u2066x\\u2069"


def test_line_breaks_tabs_and_plain_text_stay():
    plain = "Résumé:\n\ttotal = 3 → ok ✓ 日本語 «quoted» \u200b"
    assert visible(plain) == plain
    assert visible("one\r\ntwo") == "one\ntwo"  # a Windows line end is a line end


def test_cleaning_twice_changes_nothing_more():
    once = visible(HOSTILE)
    assert visible(once) == once


def test_one_line_has_no_line_breaks_or_tabs():
    assert one_line("a\tb\nc\r\nd\re") == "a b c d␍e"


# -- the Markdown view -------------------------------------------------------------
def test_markdown_keeps_its_formatting_and_loses_its_html():
    answer = (
        "# Findings\n\n**Bold** and *italic*, a [link](https://example.com/?a=1&b=2).\n\n"
        "| service | timeouts |\n|---|---|\n| a | 2 |\n\n"
        "- one\n- two\n\n> quoted\n\n"
        '<img src=x onerror="alert(1)"> <script>alert(2)</script> <!-- hidden --> &amp;'
    )
    shown = markdown_without_html(answer)
    for kept in (
        "# Findings\n",
        "**Bold**",
        "*italic*",
        "| service | timeouts |\n|---|---|",
        "- one\n- two",
        "> quoted",
        "[link](https://example.com/?a=1&amp;b=2)",
    ):
        assert kept in shown
    assert "<" not in shown
    assert '&lt;img src=x onerror="alert(1)">' in shown
    assert "&lt;script>" in shown and "&lt;!-- hidden -->" in shown
    assert "&amp;amp;" in shown  # the model's own entity is shown as written


def test_code_in_markdown_shows_its_angle_brackets_as_written():
    answer = "Use `a < b` or `print(x)`:\n\n```python\nif a < b and c & d:\n    pass\n```\nDone."
    shown = markdown_without_html(answer)
    assert "<code>a &lt; b</code>" in shown  # becomes HTML, its code escaped
    assert "`print(x)`" in shown  # nothing to escape: left as written
    assert "\n```python\nif a < b and c & d:\n    pass\n```\n" in shown
    assert shown.endswith("Done.")


# Markdown whose HTML a renderer finds where a careless escaper sees code.
TRICKY = [
    # A fence nested in a list item ends with the item, so the tag after it is HTML to
    # a renderer: an escaper that read the fence as running on would leave it raw.
    "- item\n   ```\n<img src=x onerror=alert(1)>\n```\n",
    # A backtick in a ``` line's info string: not a fence, so the tag is HTML.
    "```a`b\n<img src=x onerror=alert(1)>\n",
    # Code spans a renderer pairs differently: across lines, escaped backticks.
    "`abc\n`<img src=x onerror=alert(1)>`",
    "\\`<img src=x onerror=alert(1)>\\`",
    # A longer fence closes a shorter one.
    "```\n````\n<img src=x onerror=alert(1)>\n```\n",
]
# Markdown a model writes: the view must render it as it always did.
BENIGN = (
    "# Findings\n\nService **a** had *2* timeouts; see `grep 'a<b' log` and "
    "[the docs](https://example.com/?a=1&b=2).\n\n| service | timeouts |\n|---|---:|\n"
    "| a | 2 |\n\n1. one\n2. two\n\n> quoted\n\n---\n\n```python\nif a < b and c & d:\n"
    "    print('<ok>')\n```\n\n~~~\nplain ``` text\n~~~\n"
)
# What CommonMark renders from Markdown without HTML.
MARKDOWN_TAGS = {
    "p",
    "h1",
    "strong",
    "em",
    "code",
    "pre",
    "a",
    "ol",
    "ul",
    "li",
    "blockquote",
    "hr",
    "table",
    "thead",
    "tbody",
    "tr",
    "th",
    "td",
}


@pytest.fixture
def render():
    """A CommonMark renderer that passes HTML through, as notebook renderers do (they
    sanitize after, each its own way)."""
    markdown_it = pytest.importorskip("markdown_it")
    return markdown_it.MarkdownIt("commonmark", {"html": True}).enable("table").render


def _tags(page: str) -> set[str]:
    return set(re.findall(r"<([a-zA-Z][\w-]*)", page))


@pytest.mark.parametrize("answer", TRICKY)
def test_a_renderer_finds_no_html_of_the_models_in_the_markdown_view(render, answer):
    assert "img" in _tags(render(answer))  # raw, it would
    page = render(markdown_without_html(answer))
    assert _tags(page) <= MARKDOWN_TAGS
    assert "&lt;img src=x onerror=alert(1)&gt;" in page  # shown as text


def test_a_renderer_shows_the_models_markdown_as_it_always_did(render):
    assert render(markdown_without_html(BENIGN)) == render(BENIGN)


@pytest.mark.parametrize("answer", TRICKY)
def test_raw_angle_brackets_are_left_only_in_fenced_blocks_written_out_again(answer):
    shown = markdown_without_html(answer)
    # Written out again: after a blank line, flush left, with more backticks than any
    # run in the code, closed alike; a renderer can read them in one way only.
    block = r"\n\n(`{3,})[\w#+.-]*\n((?:.*\n)*?)\1\n\n"
    outside = re.sub(block, "", shown)
    assert "<img" not in outside.replace("<code>", "").replace("</code>", "")
    for fence, code in re.findall(block, shown):
        assert max(map(len, re.findall("`+", code)), default=0) < len(fence)


# Answers of about 1 MB shaped to make an escaper work hard.
HEAVY = {
    "unclosed backticks": "`a``<b>" * 125_000,
    "fenced blocks": "```\n<x>\n```\n" * 80_000,
    "code spans": "`a<b` " * 125_000,
    "paragraphs": "a<b `x<`\n\n" * 90_000,
    "controls": "\x1b[2J\u202e" * 170_000,
}


@pytest.mark.parametrize("shape", HEAVY)
def test_the_markdown_view_of_a_huge_answer_takes_little_time(shape):
    result = _hostile_result()
    result.final_answer = HEAVY[shape]
    started = time.perf_counter()
    result._repr_markdown_()
    # (Shown on the kernel's loop; measured 10-90 ms here, 1.0 s once with two whole
    # suites sharing two cores: the bound leaves a loaded machine room, and fails on
    # work that grows with the square of the answer.)
    assert time.perf_counter() - started < 2.0


def test_past_its_work_bounds_the_markdown_view_still_carries_no_html(render):
    # Fenced blocks beyond the number looked at, and then prose beyond them.
    answer = "```\n<i>code</i>\n```\n" * 2_100 + "<img src=x onerror=alert(1)>\n"
    assert _tags(render(markdown_without_html(answer))) <= MARKDOWN_TAGS
    spans = "`a<b` " * 2_100 + "\n<img src=x onerror=alert(1)>"
    assert _tags(render(markdown_without_html(spans))) <= MARKDOWN_TAGS


# -- the result's views and errors -------------------------------------------------
def _hostile_result(**fields) -> RLMResult:
    return RLMResult(query="q", final_answer=HOSTILE, success=True, stop_reason="final", **fields)


def test_a_results_views_show_its_answer_without_acting_on_it():
    result = _hostile_result()
    text, markdown, page = repr(result), result._repr_markdown_(), result._repr_html_()
    for view in (text, markdown, page):
        assert raw_sequences(view) == {}
        assert "␛]52;c;UFdORUQ=␇" in view
    assert "\n" not in text
    assert result.answer == HOSTILE  # the value is the model's, exactly


def test_markdown_and_html_views_carry_no_html_of_the_models():
    result = RLMResult(
        query="q",
        final_answer="# Answer\n<img src=x onerror=alert(1)><script>alert(2)</script>",
        success=False,
        stop_reason="error",
        error="the final answer quoted <script>alert(3)</script>",
    )
    for view in (result._repr_markdown_(), result._repr_html_()):
        assert "<img" not in view and "<script" not in view
    assert result._repr_markdown_().startswith("**error:** the final answer quoted &lt;script>")


def test_a_failed_runs_error_shows_the_model_text_it_quotes_without_acting_on_it():
    result = RLMResult(query="q", stop_reason="error", error=f"it said: {HOSTILE}")
    error = result.as_exception()
    for shown in (str(error), *error._render_traceback_(), f"{error}"):
        assert raw_sequences(shown) == {}
        assert "␛[2J" in shown
    assert error.result.error == f"it said: {HOSTILE}"  # the data keeps it


async def test_a_hostile_run_through_arun_keeps_its_answer_and_shows_it_cleaned(server):
    server.script("root-model", HOSTILE_RUN)
    result = await make_rlm(server).arun("What does it say?", context="c")
    assert result.success and result.final_answer == HOSTILE
    assert HOSTILE in result.trajectory[0].code[0].output  # the model saw it raw
    for view in (repr(result), result._repr_markdown_(), result._repr_html_()):
        assert raw_sequences(view) == {}


async def test_a_run_failing_on_hostile_text_raises_a_clean_error(server):
    server.script("root-model", FAILING_RUN)
    result = await make_rlm(server).arun("q", context="c")
    assert result.stop_reason == "error" and HOSTILE[:40] in result.error
    with pytest.raises(RLMRunError) as caught:
        raise result.as_exception()
    assert raw_sequences(str(caught.value)) == {}
    assert raw_sequences("".join(caught.value._render_traceback_())) == {}


# -- the terminal status line ------------------------------------------------------
class _Turn:
    def tail(self, lines: int = 12, width: int = 160) -> str:
        return STREAMED[: width - 1]


def _status() -> RunStatus:
    tree = SimpleNamespace(
        ledger=SimpleNamespace(summary=lambda: RLMResult(query="").usage),
        done=0,
        failed=0,
        in_flight=0,
        phase="thinking",
        iteration=1,
        max_iterations=30,
        live_turn=_Turn(),
    )
    return RunStatus(SimpleNamespace(tree=tree, model="m", max_iterations=30), enabled=False)


def test_the_status_line_shows_the_streaming_turn_without_acting_on_it():
    status, stream = _status(), io.StringIO()
    line = TextLine(stream)
    line.show(status)
    line.finish(status, status.line() + "\tand\nmore")
    written = stream.getvalue()
    assert raw_sequences(written) == {}
    assert "␛[2J" in written  # it was shown
    # Only the line's own controls act: a \r before each version, a \n after the last.
    assert written.count("\r") == 2 and written.endswith("and more\n")
    assert written.count("\n") == 1 and "\t" not in written
    assert not re.search("[\x00-\x08\x0b-\x0c\x0e-\x1f\x7f-\x9f]", written)


def test_the_status_widget_shows_the_streaming_turn_escaped_and_visible():
    partial = _status().partial_text()
    assert partial == visible(STREAMED) and raw_sequences(partial) == {}


# -- a real kernel -----------------------------------------------------------------
jupyter_client = pytest.importorskip("jupyter_client")


@pytest.fixture
def kernel(rlm_kernel):
    """This module's "rlm" kernel (``rlm_kernel``, from conftest)."""
    return rlm_kernel


def _strings(value) -> list[str]:
    """Every string in a message's content, decoded (JSON would spell ESC as \\u001b)."""
    if isinstance(value, str):
        return [value]
    items = value.values() if isinstance(value, dict) else value if isinstance(value, list) else []
    return [text for item in items for text in _strings(item)]


@pytest.mark.kernel
@pytest.mark.parametrize("run", ["answer", "error"])
def test_what_a_kernel_sends_its_client_carries_no_raw_controls(kernel, server, run):
    kernel.run("%config RLM.progress = True\ndoc = 'a document'")
    server.token_delay = 0.05
    server.script("root-model", HOSTILE_RUN if run == "answer" else FAILING_RUN)
    msg_id = kernel.submit(f"%%rlm -c doc --out res_{run}\nWhat does it say?")
    reply, _ = kernel.wait(msg_id, timeout=90)
    sent = [m for _, m in kernel.messages(msg_id) if m["msg_type"] != "execute_input"]
    everything = "\n".join(_strings([m["content"] for m in sent] + [reply]))
    assert "RLM openai/root-model" in everything  # (the status widget's, among them)
    assert raw_sequences(everything) == {}
    [shown] = [
        m["content"]["data"]
        for m in sent
        if m["msg_type"] == "display_data" and "text/markdown" in m["content"]["data"]
    ]
    assert "␛]52;c;UFdORUQ=␇" in shown["text/plain"]
    for page in (shown["text/markdown"], shown["text/html"]):
        assert "<img" not in page and "<script" not in page
    expected = HOSTILE if run == "answer" else "Error: " + HOSTILE
    assert kernel.value(f"res_{run}.final_answer") == expected  # the value is unchanged
    if run == "error":
        assert reply["status"] == "error" and reply["ename"] == "RLMRunError"
        assert "␛[2J" in reply["traceback"][0] and "␛[2J" in reply["evalue"]
