"""``%%llm``: one question to a model, its answer rendered as Markdown (what jupyter-ai's
``%%ai`` does), for a quick question that should not come back as a Python string.

The call is an ordinary one: the session's client (its retries, rate limits, cache and
budgets), recorded in ``%rlm usage``, interruptible. The answer streams in: in a notebook
into its output, rewritten at most ``MAX_UPDATES_PER_S`` times a second; in a terminal
onto stdout as it arrives. Model text is shown, not obeyed: Markdown without the
model's HTML, control characters visible (``rlm.render``, ``_terminal_text``).
"""

from __future__ import annotations

import asyncio
import html
import sys
import time
from typing import TYPE_CHECKING, Any

from .._terminal_text import fit, one_line, visible
from ..errors import describe_exception
from ..llm.usage import format_cost
from ..rlm.render import markdown_html, markdown_without_html
from .progress import MAX_UPDATES_PER_S, widgets_available

if TYPE_CHECKING:
    from ..rlm.runner import RLM


class LLMAnswer:
    """A ``%%llm`` cell's answer: Markdown in a notebook, the text in a terminal."""

    def __init__(self, model: str, text: str = "", completion: Any = None):
        self.model = model
        self.text = text
        self.completion = completion  # None while the answer streams in
        self.started = time.perf_counter()
        # Set when the call failed or was interrupted: (how it ended, seconds it took).
        self.ended: tuple[str, float] | None = None

    def fail(self, error: BaseException) -> None:
        """The call ended without an answer: the figures line says how, once, in place
        of "answering…" (the error itself follows as the cell's error)."""
        took = time.perf_counter() - self.started
        if isinstance(error, (KeyboardInterrupt, asyncio.CancelledError)):
            self.ended = ("interrupted", took)
        else:
            self.ended = (f"failed: {fit(one_line(describe_exception(error)), 160)}", took)

    def meta(self) -> str:
        """The call in figures, as other calls show them: model, tokens, cost, time."""
        done = self.completion
        if done is None and self.ended is not None:
            how, took = self.ended
            return f"{self.model} · {how} · {took:.1f}s"
        if done is None:
            return f"{self.model} · answering… · {time.perf_counter() - self.started:.1f}s"
        cached = " · from the cache" if done.cached else ""
        return (
            f"{done.model or self.model} · {done.input_tokens:,} + {done.output_tokens:,} "
            f"tokens · {format_cost(done.cost_usd)} · {done.elapsed_s:.1f}s{cached}"
        )

    def __repr__(self) -> str:
        return visible(self.text)

    def _repr_markdown_(self) -> str:
        meta = self.meta().replace("$", "\\$")
        return f"{markdown_without_html(visible(self.text))}\n\n*{html.escape(meta)}*"

    def _repr_html_(self) -> str:
        # (The classes keep MathJax off "$"; see rlm.render.)
        return (
            "<div class='rlm-llm tex2jax_ignore mathjax_ignore'>"
            f"{markdown_html(visible(self.text))}"
            f"<p style='opacity:0.7;font-size:90%'>{html.escape(self.meta())}</p></div>"
        )


class NotebookStream:
    """The answer in the cell's output as it arrives, rewritten in place."""

    def __init__(self, answer: LLMAnswer):
        from IPython.display import display

        self.answer = answer
        self.handle = display(answer, display_id=True)
        self.next_at = time.perf_counter() + 1 / MAX_UPDATES_PER_S

    def text(self, piece: str | None) -> None:
        self.answer.text = "" if piece is None else self.answer.text + piece
        if time.perf_counter() >= self.next_at:
            self.show()

    def show(self) -> None:
        started = time.perf_counter()
        self.handle.update(self.answer)
        # Each update renders the whole answer so far, on the loop: a long answer is
        # shown less often, so rendering never takes more than a fifth of the loop.
        took = time.perf_counter() - started
        self.next_at = time.perf_counter() + max(1 / MAX_UPDATES_PER_S, 4 * took)

    def ended(self) -> None:
        """The call failed: what arrived stays, under the line saying how it ended."""
        self.handle.update(self.answer)


class TerminalStream:
    """The answer written onto stdout as it arrives, then its figures on stderr."""

    def __init__(self, answer: LLMAnswer):
        self.answer = answer
        self.written = False

    def text(self, piece: str | None) -> None:
        self.written = True
        if piece is None:  # the call starts over (a retry): say so, do not erase
            if self.answer.text:
                sys.stdout.write("\n[the answer starts over]\n")
            self.answer.text = ""
            return
        self.answer.text += piece
        sys.stdout.write(visible(piece))
        sys.stdout.flush()

    def show(self) -> None:
        if not self.written:  # not streamed (from the cache): all of it now
            sys.stdout.write(visible(self.answer.text))
        sys.stdout.write("\n")
        sys.stdout.flush()
        print(self.answer.meta(), file=sys.stderr)

    def ended(self) -> None:
        """The call failed: end the streamed line, so the error starts on its own."""
        if self.answer.text:
            sys.stdout.write("\n")
            sys.stdout.flush()


async def ask(
    rlm: RLM, question: str, *, model: str | None, system: str | None, quiet: bool
) -> LLMAnswer:
    """Ask ``question``, streaming the answer into the cell; returns the answer."""
    from ..llm.messages import build_messages
    from .interrupts import run_interruptibly

    model = model or rlm.model
    answer = LLMAnswer(model)
    stream: NotebookStream | TerminalStream | None = None
    if not quiet:
        stream = NotebookStream(answer) if widgets_available() else TerminalStream(answer)
    try:
        completion = await run_interruptibly(
            rlm.client.complete(
                build_messages(question, system, caller="%%llm"),
                model=model,
                stream=True,
                on_text=stream.text if stream is not None else None,
            ),
            "%%llm",
        )
    except BaseException as error:  # re-raised: the cell fails with it
        answer.fail(error)
        if stream is not None:
            stream.ended()
        raise
    answer.text, answer.completion = completion.text, completion
    if stream is not None:
        stream.show()
    return answer
