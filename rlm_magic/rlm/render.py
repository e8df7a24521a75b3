"""How a run's result reads: HTML and Markdown for ``RLMResult`` (its ``_repr_html_``
and ``_repr_markdown_``, which Jupyter, nbconvert and terminals pick from).

The answer comes first; the trajectory follows, collapsed, with syntax-highlighted code
and each block's output exactly as the model saw it.

Model text is shown, never obeyed: in both views its control characters are visible
(``_terminal_text``), and the HTML view escapes it whole.
"""

from __future__ import annotations

import html
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
    answer = visible(result.final_answer) if result.final_answer is not None else "*(no answer)*"
    lines = []
    if not result.success and result.error:
        lines.append(f"**{result.stop_reason or 'failed'}:** {visible(result.error)}\n")
    lines += [answer, "", f"*{_status_line(result)}*"]
    return "\n".join(lines)


def _shown(text: str) -> str:
    """Model text for HTML: its control characters visible, escaped."""
    return html.escape(visible(text))
