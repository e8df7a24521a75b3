"""How a run's result reads: HTML and Markdown for ``RLMResult`` (its ``_repr_html_``
and ``_repr_markdown_``, which Jupyter, nbconvert and terminals pick from).

The answer comes first; the trajectory follows, collapsed, with syntax-highlighted code
and each block's output exactly as the model saw it.

Model text is shown, never obeyed: in both views its control characters are visible
(``_terminal_text``), and its Markdown (headings, emphasis, lists, tables, code) is kept
but none of its HTML: the HTML view renders the answer with markdown-it (``html=False``,
``markdown_html``), the Markdown view escapes it (``markdown_without_html``). A ``$`` is
money, not math, in either view.

JupyterLab, Notebook 7 and VS Code pick the HTML view (they rank text/html above
text/markdown), so the HTML view is the one that must render the Markdown: emitting
only text/markdown would lose the collapsible trajectory.
"""

from __future__ import annotations

import html
import itertools
import re
from bisect import bisect
from typing import Any

from .._terminal_text import one_line, visible
from ..llm.usage import format_cost
from .replies import with_code_as_pointers

# ``result`` below is an ``RLMResult``: typed as Any, since result.py imports this module
# (a run's result renders itself) and this module must not import it back.

# The look is in inline styles that JupyterLab's sanitizer keeps (an untrusted notebook's
# outputs lose every <style> element): colours as hex or rgba() with a leading zero, no
# var(). The class names stay, for anyone styling the result.
_STYLE = {
    "result": "line-height:1.45",
    "answer": "padding:0.3em 0.8em;margin:0.2em 0;border-left:4px solid #2e7d32;"
    "background-color:rgba(46,125,50,0.08)",
    "failed": "padding:0.3em 0.8em;margin:0.2em 0;border-left:4px solid #c62828;"
    "background-color:rgba(198,40,40,0.08)",
    "pre": "margin:0.2em 0 0.6em;padding:0.4em 0.6em;background-color:rgba(127,127,127,0.12);"
    "white-space:pre;overflow-x:auto;max-height:30em",
    "meta": "opacity:0.7;font-size:90%",
    "error": "color:#c62828",
    "amber": "color:#b26a00",
}
# What inline styles cannot say, in a <style> a trusted notebook keeps: pygments' light
# colours inverted where the theme is dark (untrusted, code reads black on light grey),
# and the usage table's total row in bold.
_CSS = """<style>
body[data-jp-theme-light="false"] .rlm-result .highlight,body.vscode-dark .rlm-result .highlight{filter:invert(.88) hue-rotate(180deg)}
.rlm-result tr.rlm-total td{font-weight:600}
.rlm-result td:first-child,.rlm-result th:first-child{text-align:left}
</style>"""
# MathJax (JupyterLab, Notebook, ipywidgets' HTML) skips elements of these classes, so
# "$1,200 and saved $5,000" stays text instead of becoming math.
_NO_MATH = "tex2jax_ignore mathjax_ignore"


def _no_math(escaped: str) -> str:
    """HTML text with each ``$`` alone in a ``<span>``: MathJax looks for a pair of
    delimiters within one run of text, and an element ends the run. (For renderers that
    ignore ``_NO_MATH``.)"""
    return escaped.replace("$", "<span>$</span>")


def _highlight(code: str) -> str:
    try:
        from pygments import highlight
        from pygments.formatters import HtmlFormatter
        from pygments.lexers import PythonLexer
    except ImportError:
        return _pre(html.escape(code))
    highlighted: str = highlight(code, PythonLexer(), HtmlFormatter(noclasses=True, nowrap=False))
    # Pygments' colours are for a light page: its plain text too.
    return f"<div style='color:#000000'>{highlighted}</div>"


def _pre(escaped: str) -> str:
    return f"<pre style='{_STYLE['pre']}'>{escaped}</pre>"


def _meta(escaped: str) -> str:
    return f"<p class='rlm-meta' style='{_STYLE['meta']}'>{escaped}</p>"


def status_line(result: Any) -> str:
    """The run in figures, one line: how it ended, iterations, sub-calls, tokens, cost,
    time."""
    usage = result.usage
    status = "answered" if result.success else (result.stop_reason or "failed")
    compacted = f"{len(result.compactions)} compaction(s) · " if result.compactions else ""
    return (
        f"{status} · {result.iterations} iteration(s) · {compacted}"
        f"{sum(i.sub_calls for i in result.trajectory)} sub-call(s) · "
        f"{usage.total.total_tokens:,} tokens · "
        f"{format_cost(usage.cost_usd, usage.total.unpriced_calls)} · "
        f"{result.elapsed_s:.1f}s"
        + (f" · finished by {result.finished_by}" if result.finished_by else "")
        + (f" · answer: {result.answer_origin}" if result.answer_origin else "")
    )


_status_line = status_line  # (its earlier name)


def result_html(result: Any, *, with_error: bool = True) -> str:
    """The result as HTML: its answer rendered from Markdown, then the figures, the
    trajectory (collapsed) and the usage. Empty parts are left out: a run with no
    answer draws no answer box, one with no iteration no trajectory. ``with_error=False``
    leaves out a failed run's error, for a cell that raises it just after."""
    failed = not result.success
    kind = "rlm-result rlm-failed" if failed else "rlm-result"
    parts = [_CSS, f"<div class='{kind} {_NO_MATH}' style='{_STYLE['result']}'>"]
    if failed and result.error and with_error:
        parts.append(
            f"<p style='{_STYLE['error']}'><b>{html.escape(result.stop_reason or 'failed')}:</b> "
            f"{_no_math(_shown(result.error))}</p>"
        )
    said_nothing = answer_said_nothing(result)
    if said_nothing:
        parts.append(f"<p style='{_STYLE['amber']}'>{_no_math(html.escape(said_nothing))}</p>")
    if result.final_answer is not None:
        box = "failed" if failed else "answer"
        parts.append(
            f"<div class='rlm-answer' style='{_STYLE[box]}'>"
            f"{markdown_html(visible(result.final_answer))}</div>"
        )
    if result.answer_origin:
        parts.append(
            f"<p style='{_STYLE['error']}'><b>Not this question's own answer:</b> it is "
            f"{html.escape(result.answer_origin)} (data of that question's context).</p>"
        )
    parts.append(_meta(_no_math(html.escape(status_line(result)))))
    if result.trajectory:
        parts.append(f"<details><summary>Trajectory ({result.iterations} iterations)</summary>")
        parts.extend(_iteration_html(it) for it in result.trajectory)
        parts.append("</details>")
    if result.usage.calls:
        parts.append(
            "<details><summary>Usage</summary>" + result.usage._repr_html_() + "</details>"
        )
    parts.append("</div>")
    return "".join(parts)


def _iteration_html(it: Any) -> str:  # a result.Iteration
    parts = []
    if it.compaction is not None:
        parts.append(_compaction_html(it.compaction))
    parts.append(
        f"<details><summary>Iteration {it.index} · {len(it.code)} block(s) · "
        f"{it.sub_calls} sub-call(s) · {it.elapsed_s:.2f}s</summary>"
    )
    parts.append(f"<div><b>Model</b>{_pre(_shown(with_code_as_pointers(it.response)))}</div>")
    for note in it.notes:
        parts.append(_meta(_shown(note)))
    for item in it.withheld:  # written before the model saw its code's output
        parts.append(_meta(f"Not taken ({item.why}): {_shown(item.what)}"))
    if it.cut_answers:
        parts.append(_meta(f"{it.cut_answers} sub-call answer(s) stopped at max_tokens (cut off)"))
    for number, block in enumerate(it.code, 1):
        parts.append(
            f"<div><b>Block {number}</b> ({block.elapsed_s:.2f}s)"
            f"{_highlight(visible(block.code))}<b>Output</b>"
            f"{_pre(_shown(block.output))}</div>"
        )
    parts.append("</details>")
    return "".join(parts)


_MARKDOWN: Any = None
# markdown-it-py is linear, but up to ~10 µs a character on hostile text (measured:
# 100,000 "[" in 0.94 s), on the kernel's loop: past this, an answer is shown as text.
MARKDOWN_AT_MOST = 100_000


def markdown_html(text: str) -> str:
    """Model Markdown as HTML (CommonMark, tables, strikethrough), with none of the
    model's HTML: its tags and entities show as written. Images are not drawn (an
    image's address would be fetched by the browser: a way out for what the model read),
    nor links with a script, data or file address; ``$`` stays text (see ``_no_math``)."""
    global _MARKDOWN
    if len(text) > MARKDOWN_AT_MOST:
        return (
            f"<p style='{_STYLE['meta']}'>(over {MARKDOWN_AT_MOST:,} characters: shown as "
            f"text)</p><div style='white-space:pre-wrap'>{_no_math(html.escape(text))}</div>"
        )
    if _MARKDOWN is None:
        from markdown_it import MarkdownIt  # imported on the first answer shown

        md = MarkdownIt("commonmark", {"html": False}).enable(["table", "strikethrough"])
        md.disable("image")
        md.add_render_rule(
            "text",
            lambda self, tokens, idx, options, env: _no_math(html.escape(tokens[idx].content)),
        )
        _MARKDOWN = md
    rendered: str = _MARKDOWN.render(text)
    return rendered


def compaction_line(compaction: Any) -> str:  # a result.Compaction
    """One line on a compaction: why, how much smaller, what the summary cost."""
    cost = format_cost(compaction.cost_usd)
    return (
        f"Conversation compacted ({compaction.reason}): ~{compaction.tokens_before:,} "
        f"→ ~{compaction.tokens_after:,} tokens; the summary cost "
        f"{compaction.input_tokens:,} + {compaction.output_tokens:,} tokens, {cost}; "
        "full history in the REPL variable `history`"
    )


def _compaction_html(compaction: Any) -> str:
    return (
        f"<details class='rlm-compaction'><summary>{html.escape(compaction_line(compaction))}"
        f"</summary>{_pre(_shown(compaction.summary))}</details>"
    )


def answer_said_nothing(result: Any) -> str:
    """One line on the last answer the run did not take because it said nothing (a
    label with an empty value: ``finishing.empty``), where the run has no answer; ""
    otherwise. Where it came from: the marker or call that gave it, and the turn."""
    if result.success:
        return ""
    found = [("its last turn", n) for n in result.notes if _said_nothing(n)]
    for iteration in reversed(result.trajectory):
        if found:
            break
        found = [(f"iteration {iteration.index}", n) for n in iteration.notes if _said_nothing(n)]
    if not found:
        return ""
    where, note = found[-1]
    what = note[len("not taken: ") :].replace(", so the run went on", "")
    return one_line(f"No answer: in {where}, {what}, so it was not taken.")


def _said_nothing(note: str) -> bool:
    # (How ``finishing.answers.Finishing.said_nothing`` notes it.)
    return note.startswith("not taken: ") and " says nothing (" in note


def result_markdown(result: Any, *, with_error: bool = True) -> str:
    lines = []
    if not result.success and result.error and with_error:
        error = _escaped(visible(result.error))
        lines.append(f"**{result.stop_reason or 'failed'}:** {error}\n")
    said_nothing = answer_said_nothing(result)
    if said_nothing:
        lines.append(f"*{_escaped(said_nothing)}*\n")
    if result.final_answer is not None:
        lines += [markdown_without_html(visible(result.final_answer)), ""]
    lines.append(f"*{_escaped(status_line(result))}*")
    return "\n".join(lines)


def markdown_as_text(markdown: str) -> str:
    """What this module's Markdown view reads as in a terminal: a line that is all
    emphasis (``*answered · ... \\$0.0034*``, the figures) without its asterisks, a bold
    label without its own, and the escapes ``_escaped`` adds undone. For a summary
    printed in a terminal (``scripts/run_notebook.py --summary``, the quickstart's)."""
    lines = []
    for line in markdown.splitlines():
        bold = re.match(r"^\*\*([^*]+)\*\*(.*)$", line)
        if bold:
            line = bold[1] + bold[2]
        elif len(line) > 2 and line[0] == line[-1] == "*" and line[1] != "*":
            line = line[1:-1]
        lines.append(line.replace("\\$", "$").replace("&lt;", "<").replace("&amp;", "&"))
    return "\n".join(lines)


def _shown(text: str) -> str:
    """Model text for HTML: its control characters visible, escaped."""
    return html.escape(visible(text))


def _escaped(text: str) -> str:
    """Text with its ``&`` and ``<`` escaped, so no HTML (a tag, a comment, an entity)
    can begin in it (``>`` stays, as Markdown's quote marker), and its ``$`` escaped,
    so that Jupyter's Markdown does not read math between two of them."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace("$", "\\$")


# A line that may open or close a fenced code block, by CommonMark's rules (indented at
# most three columns; tabs taken as one, so more lines are read as fences than a
# renderer would): its indentation, its fence and what follows it on the line.
_FENCE = re.compile(r"^([ \t]{0,3})(`{3,}|~{3,})(.*)$", re.MULTILINE)
_BACKTICKS = re.compile(r"`+")
_PARAGRAPH_BREAK = re.compile(r"\n[ \t]*\n")
# Whatever the model wrote, the time this takes stays small (a 1 MB answer, tens of ms):
# past this many fence lines the rest is one block or prose; in prose holding more runs
# of backticks or paragraphs than this, code spans are not looked for (their code is
# shown escaped).
_MOST = 2_000


def markdown_without_html(text: str) -> str:
    """``text`` as Markdown with none of its HTML: each ``<`` and ``&`` is escaped but
    in code, which a Markdown renderer shows as written.

    Code keeps working without trusting the renderer to find the same code as this
    function. A fenced block is written out again in a form every CommonMark renderer
    reads alike: after a blank line, flush left, fenced with more backticks than its code
    holds in a row, its info string cut to a language name, closed the same way. Only
    such blocks keep their ``<``; so a fence the renderer reads differently from the
    model's (say, nested in a list item) cannot hide HTML from this function. A code
    span whose code holds ``<`` or ``&`` becomes ``<code>`` with its code escaped;
    others stay as written. (Lines end at ``\\n`` only, as in CommonMark.)
    """
    out: list[str] = []
    at = 0  # where the text not yet written out begins
    opening: re.Match[str] | None = None
    for fence in itertools.islice(_FENCE.finditer(text), _MOST):
        if opening is None:
            if fence[2][0] == "`" and "`" in fence[3]:
                continue  # a ``` line with a backtick after it is no fence
            out.append(_prose(text[at : fence.start()]))
            opening, at = fence, fence.end() + 1
        elif fence[2][0] == opening[2][0] and len(fence[2]) >= len(opening[2]):
            if not fence[3].strip(" \t"):
                out.append(_fenced_block(text[at : fence.start()], opening))
                opening, at = None, fence.end() + 1
    if opening is not None:  # never closed: the block runs to the end
        out.append(_fenced_block(text[at:], opening))
    else:
        out.append(_prose(text[at:]))
    return "".join(out)


def _prose(text: str) -> str:
    if "<" not in text and "&" not in text and "$" not in text:
        return text
    parts, at = [], 0
    for start, end, code in _code_spans(text):
        parts.append(_escaped(text[at:start]))
        if "<" in code or "&" in code:
            if code.startswith(" ") and code.endswith(" ") and code.strip():
                code = code[1:-1]  # as CommonMark strips one space each side
            code = html.escape(code.replace("\n", " "), quote=False)
            parts.append(f"<code>{code}</code>")
        else:
            parts.append(text[start:end])  # as written: a ``$`` in code is no math
        at = end
    parts.append(_escaped(text[at:]))
    return "".join(parts)


def _code_spans(text: str) -> list[tuple[int, int, str]]:
    """Each code span: where it starts and ends, and its code. A run of backticks opens
    one when a later run of the same length in its paragraph closes it (in time linear
    in the text: a thousand unclosed backticks are not a thousand searches to its end)."""
    runs = [(m.start(), m.end()) for m in itertools.islice(_BACKTICKS.finditer(text), _MOST + 1)]
    if len(runs) > _MOST or text.count("\n\n") > _MOST:
        return []
    breaks = [m.start() for m in itertools.islice(_PARAGRAPH_BREAK.finditer(text), _MOST + 1)]
    if len(breaks) > _MOST:
        return []
    by_length: dict[int, list[int]] = {}
    for number, (start, end) in enumerate(runs):
        by_length.setdefault(end - start, []).append(number)
    seen = dict.fromkeys(by_length, 0)  # per length: how many of its runs lie behind
    spans, number = [], 0
    while number < len(runs):
        start, end = runs[number]
        same = by_length[end - start]
        while seen[end - start] < len(same) and same[seen[end - start]] <= number:
            seen[end - start] += 1
        closer = same[seen[end - start]] if seen[end - start] < len(same) else None
        if closer is None or bisect(breaks, start) != bisect(breaks, runs[closer][0]):
            number += 1  # not closed in its paragraph: plain backticks
            continue
        spans.append((start, runs[closer][1], text[end : runs[closer][0]]))
        number = closer + 1
    return spans


def _fenced_block(code: str, opening: re.Match[str]) -> str:
    indent = len(opening[1])
    if indent:  # as CommonMark: each line less as many spaces as its fence had
        code = re.sub(f"(?m)^ {{1,{indent}}}", "", code)
    longest = max((len(run) for run in _BACKTICKS.findall(code)), default=0)
    fence = "`" * max(3, longest + 1)
    language = re.match(r"[\w#+.-]*", opening[3].strip())
    end = "" if not code or code.endswith("\n") else "\n"
    return f"\n{fence}{language[0] if language else ''}\n{code}{end}{fence}\n\n"
