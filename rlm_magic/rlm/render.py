"""How a run's result reads: HTML and Markdown for ``RLMResult`` (its ``_repr_html_``
and ``_repr_markdown_``, which Jupyter, nbconvert and terminals pick from).

The answer comes first; the trajectory follows, collapsed, with syntax-highlighted code
and each block's output exactly as the model saw it.

Model text is shown, never obeyed: in both views its control characters are visible
(``_terminal_text``), the HTML view escapes it whole, and the Markdown view keeps the
model's Markdown (headings, emphasis, lists, tables, code) but none of its HTML
(``markdown_without_html``).
"""

from __future__ import annotations

import html
import itertools
import re
from bisect import bisect
from typing import Any

from .._terminal_text import visible
from ..llm.usage import format_cost
from .replies import with_code_as_pointers

# ``result`` below is an ``RLMResult``: typed as Any, since result.py imports this module
# (a run's result renders itself) and this module must not import it back.

# Selectors are doubled (.rlm-result.rlm-result) to outrank JupyterLab's own
# `.jp-RenderedHTMLCommon pre` rules, which would otherwise strip boxes and padding.
_CSS = """<style>
.rlm-result{font-family:var(--jp-content-font-family,sans-serif);line-height:1.45}
.rlm-result.rlm-result .rlm-answer{padding:.5em .8em;border-left:4px solid #2e7d32;background:rgba(46,125,50,.12);white-space:pre-wrap}
.rlm-result.rlm-failed .rlm-answer{border-color:#c62828;background:rgba(198,40,40,.12)}
.rlm-result details{margin:.3em 0}
.rlm-result summary{cursor:pointer;font-weight:600}
.rlm-result.rlm-result pre{margin:.2em 0 .6em;padding:.4em .6em;background:rgba(127,127,127,.12);white-space:pre;overflow-x:auto;max-height:30em}
.rlm-result.rlm-result .highlight pre{background:#f8f8f8;color:#000}
body[data-jp-theme-light="false"] .rlm-result .highlight,body.vscode-dark .rlm-result .highlight{filter:invert(.88) hue-rotate(180deg)}
.rlm-result table{border-collapse:collapse;margin-top:.5em}
.rlm-result td,.rlm-result th{padding:2px 8px;border-bottom:1px solid rgba(127,127,127,.3);text-align:right}
.rlm-result td:first-child,.rlm-result th:first-child{text-align:left}
.rlm-result tr.rlm-total td{font-weight:600}
.rlm-result .rlm-meta{opacity:.7;font-size:90%}
</style>"""


def _highlight(code: str) -> str:
    try:
        from pygments import highlight
        from pygments.formatters import HtmlFormatter
        from pygments.lexers import PythonLexer
    except ImportError:
        return f"<pre>{html.escape(code)}</pre>"
    highlighted: str = highlight(code, PythonLexer(), HtmlFormatter(noclasses=True, nowrap=False))
    return highlighted


def _status_line(result: Any) -> str:
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
    )


def result_html(result: Any) -> str:
    answer = visible(result.final_answer) if result.final_answer is not None else ""
    parts = [_CSS, f"<div class='rlm-result{'' if result.success else ' rlm-failed'}'>"]
    if not result.success and result.error:
        parts.append(
            f"<p><b>{html.escape(result.stop_reason or 'failed')}:</b> "
            f"{html.escape(visible(result.error))}</p>"
        )
    parts.append(f"<div class='rlm-answer'>{html.escape(answer) or '<i>(no answer)</i>'}</div>")
    parts.append(f"<p class='rlm-meta'>{html.escape(_status_line(result))}</p>")
    parts.append(f"<details><summary>Trajectory ({result.iterations} iterations)</summary>")
    for it in result.trajectory:
        if it.compaction is not None:
            parts.append(_compaction_html(it.compaction))
        parts.append(
            f"<details><summary>Iteration {it.index} · {len(it.code)} block(s) · "
            f"{it.sub_calls} sub-call(s) · {it.elapsed_s:.2f}s</summary>"
        )
        parts.append(
            f"<div><b>Model</b><pre>{_shown(with_code_as_pointers(it.response))}</pre></div>"
        )
        for note in it.notes:
            parts.append(f"<p class='rlm-meta'>{_shown(note)}</p>")
        for item in it.withheld:  # written before the model saw its code's output
            parts.append(f"<p class='rlm-meta'>Not taken ({item.why}): {_shown(item.what)}</p>")
        if it.cut_answers:
            parts.append(
                f"<p class='rlm-meta'>{it.cut_answers} sub-call answer(s) stopped "
                "at max_tokens (cut off)</p>"
            )
        for number, block in enumerate(it.code, 1):
            parts.append(
                f"<div><b>Block {number}</b> ({block.elapsed_s:.2f}s)"
                f"{_highlight(visible(block.code))}<b>Output</b>"
                f"<pre>{_shown(block.output)}</pre></div>"
            )
        parts.append("</details>")
    parts.append("</details>")
    parts.append(
        "<details><summary>Usage</summary>" + result.usage._repr_html_() + "</details></div>"
    )
    return "".join(parts)


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
        f"</summary><pre>{_shown(compaction.summary)}</pre></details>"
    )


def result_markdown(result: Any) -> str:
    answer = (
        markdown_without_html(visible(result.final_answer))
        if result.final_answer is not None
        else "*(no answer)*"
    )
    lines = []
    if not result.success and result.error:
        error = _escaped(visible(result.error))
        lines.append(f"**{result.stop_reason or 'failed'}:** {error}\n")
    lines += [answer, "", f"*{_status_line(result)}*"]
    return "\n".join(lines)


def _shown(text: str) -> str:
    """Model text for HTML: its control characters visible, escaped."""
    return html.escape(visible(text))


def _escaped(text: str) -> str:
    """Text with its ``&`` and ``<`` escaped, so no HTML (a tag, a comment, an entity)
    can begin in it; ``>`` stays, as Markdown's quote marker."""
    return text.replace("&", "&amp;").replace("<", "&lt;")


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
    if "<" not in text and "&" not in text:
        return text
    parts, at = [], 0
    for start, end, code in _code_spans(text):
        if "<" in code or "&" in code:
            parts.append(_escaped(text[at:start]))
            if code.startswith(" ") and code.endswith(" ") and code.strip():
                code = code[1:-1]  # as CommonMark strips one space each side
            code = html.escape(code.replace("\n", " "), quote=False)
            parts.append(f"<code>{code}</code>")
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
