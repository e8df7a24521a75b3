"""Live progress: a batch's progress bar and a ``%%rlm`` run's status panel.

In a notebook they are ipywidgets; in a terminal (terminal IPython, jupyter console, a
script) one compact text line on stderr, rewritten in place, ending as a summary line.
Updates are pushed from the kernel's loop (widgets must not be touched from other
threads since ipykernel 7) by a timer at most ``MAX_UPDATES_PER_S`` times a second, so a
fast batch does not flood the frontend with comm messages.

Beside every widget view sits a text/plain line, what a viewer without widgets shows
(GitHub, nbviewer, an executed copy from papermill or nbconvert). It is the status as
one line, rewritten with ``update_display_data`` when the work ends, so a saved notebook
shows how the work ended, not how it started.
"""

from __future__ import annotations

import asyncio
import html
import os
import sys
import time
from collections.abc import Callable
from typing import Any, Protocol

from .._terminal_text import fit, one_line, visible, width
from ..llm.litellm_loader import litellm_is_loading
from ..llm.ratelimit import hold_message
from ..llm.slots import hold_message as slots_message
from ..llm.usage import format_cost, format_saving
from ..maps.run_map import MapObserver

MAX_UPDATES_PER_S = 4
# The first call of a session imports litellm, which takes seconds.
LOADING_LITELLM = "loading litellm…"


def widgets_available() -> bool:
    """True when this cell came from a Jupyter frontend that can render widgets."""
    from IPython import get_ipython

    shell = get_ipython()
    kernel = getattr(shell, "kernel", None)
    if kernel is None:
        return False  # terminal IPython, a script
    try:
        request = kernel.get_parent("shell") or {}
    except Exception:  # noqa: BLE001 - an unusual kernel: assume a notebook
        return True
    return not from_a_terminal_client(request)


def from_a_terminal_client(request: dict) -> bool:
    """Whether an execute_request came from a terminal client (jupyter console,
    qtconsole), which prints a widget's text/plain instead of rendering it.

    As measured: jupyter console sends ``allow_stdin: true`` and empty metadata.
    Notebook frontends name the cell they run (``metadata.cellId``, sent by JupyterLab
    and Notebook 7), and headless runners (nbclient, so papermill, nbconvert and nbval)
    send ``allow_stdin: false``: both get widgets, with their text/plain line.
    """
    content = request.get("content") or {}
    metadata = request.get("metadata") or {}
    return bool(content.get("allow_stdin")) and "cellId" not in metadata


class _View(Protocol):
    """What a live display shows itself in: a widget view, or a ``TextLine``. Each
    takes the display it was made for (a widget view, its own kind of display)."""

    def show(self, display: Any) -> None: ...

    def update(self, display: Any) -> None: ...

    def finish(self, display: Any, line: str) -> None: ...


class _LiveDisplay:
    """Shows a view, refreshes it on a timer while the work runs, then settles it.

    Subclasses give ``line()`` (the status as one line of text) and ``_widget_view()``.
    """

    def __init__(self, enabled: bool):
        self.started = time.perf_counter()
        self._view: _View | None = None
        self._timer: asyncio.TimerHandle | None = None
        if enabled:
            self._view = self._widget_view() if widgets_available() else TextLine()

    @property
    def elapsed_s(self) -> float:
        return time.perf_counter() - self.started

    def line(self, *, stopped: bool = False) -> str:
        raise NotImplementedError

    def compact_line(self) -> str:
        """The line with less in it, for a narrow terminal."""
        return self.line()

    def final_line(self, exc_type) -> str:
        interrupted = exc_type is not None and not issubclass(exc_type, Exception)
        return self.line(stopped=True) + (" (interrupted)" if interrupted else "")

    def _widget_view(self) -> _View:
        raise NotImplementedError

    def __enter__(self):
        view = self._view
        if view is not None:
            view.show(self)
            self._schedule(view)
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._view is not None:
            self._view.finish(self, self.final_line(exc_type))

    def _schedule(self, view: _View) -> None:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return  # no loop, no live updates: the final line still shows
        self._timer = loop.call_later(1 / MAX_UPDATES_PER_S, self._tick, view)

    def _tick(self, view: _View) -> None:
        view.update(self)  # elapsed time moves even when nothing else did
        self._schedule(view)


class BatchProgress(_LiveDisplay, MapObserver):
    """Counts a batch's items and shows them; a map's (or a batch's) observer."""

    def __init__(
        self,
        total: int,
        label: str = "llm_query_batch",
        *,
        enabled: bool = True,
        hold: Callable[[], str | None] | None = None,
    ):
        self.total = total
        self.label = label
        self.hold = hold  # says what holds the batch back (a provider's rate limit)
        self.done = 0  # answered (from disk and from the cache included)
        self.failed = 0
        self.from_disk = 0  # answered by an earlier run of the same map (resume)
        self.cached = 0  # answered from RLM.cache, not sent
        self.unsent = 0  # items a cost budget had no room for
        self.in_flight = 0
        self.input_tokens = 0
        self.output_tokens = 0
        self.cost_usd: float | None = None
        super().__init__(enabled)

    def _widget_view(self) -> BarWidget:
        return BarWidget()

    # -- observer ---------------------------------------------------------------------
    def kept(self, count: int) -> None:
        self.done = self.from_disk = count  # answered by an earlier run of the same map

    def item_started(self, index: int) -> None:
        self.in_flight += 1

    def item_finished(self, index: int, result: Any) -> None:
        self.in_flight -= 1
        self.done += 1
        completion = getattr(result, "completion", result)  # a typed answer's, or itself
        self.cached += bool(getattr(completion, "cached", False))
        self.input_tokens += getattr(result, "input_tokens", 0) or 0
        self.output_tokens += getattr(result, "output_tokens", 0) or 0
        cost = getattr(result, "cost_usd", None)
        if cost is not None:
            self.cost_usd = (self.cost_usd or 0.0) + cost

    def item_failed(self, index: int, error: BaseException) -> None:
        self.in_flight -= 1
        self.failed += 1

    def not_sent(self, count: int, reason: Any) -> None:
        self.unsent = count

    def pace(self, stopped: bool = False) -> str | None:
        """As tqdm shows it: items a second (or seconds an item) over this run's items,
        and, while it runs, the time left at that pace. None before the first item."""
        finished = self.done + self.failed - self.from_disk
        elapsed = self.elapsed_s
        if finished <= 0 or elapsed <= 0:
            return None
        rate = finished / elapsed
        shown = f"{rate:.1f} items/s" if rate >= 1 else f"{1 / rate:.1f} s/item"
        left = self.total - self.done - self.failed - self.unsent
        if stopped or left <= 0:
            return shown
        return f"{shown}, ~{_duration(left / rate)} left"

    def line(self, stopped: bool = False) -> str:
        parts = [f"{self.label}: {self.done}/{self.total} done"]
        if self.from_disk:
            parts.append(f"{self.from_disk} from disk")
        if self.cached:
            parts.append(f"{self.cached} from the cache")
        if self.failed:
            parts.append(f"{self.failed} failed")
        if self.unsent:
            parts.append(f"{self.unsent} not sent (cost budget)")
        if self.in_flight and not stopped and litellm_is_loading():
            parts.append(LOADING_LITELLM)  # nothing is sent yet: do not look stalled
        elif self.in_flight:
            # Once the batch has stopped, calls still counted in flight were cancelled.
            parts.append(f"{self.in_flight} {'cancelled' if stopped else 'in flight'}")
        held = None if stopped else (self.hold() if self.hold else None) or slots_message()
        if held:
            parts.append(held)
        pace = self.pace(stopped)
        if pace:
            parts.append(pace)
        parts.append(f"{self.elapsed_s:.1f}s")
        tokens = self.input_tokens + self.output_tokens
        if tokens:
            parts.append(f"{tokens:,} tokens")
            parts.append(format_cost(self.cost_usd))
        return " | ".join(parts)


def _duration(seconds: float) -> str:
    """``42s``, ``3:05``, ``1:02:05``: as a clock reads, past a minute."""
    whole = int(seconds + 0.5)
    if whole < 60:
        return f"{whole}s"
    minutes, secs = divmod(whole, 60)
    if minutes < 60:
        return f"{minutes}:{secs:02d}"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}"


class RunStatus(_LiveDisplay):
    """One live status panel for a ``%%rlm`` run: iteration, what the root model is
    doing, sub-calls done / in flight (children included), tokens, cost, time."""

    def __init__(self, run, *, enabled: bool = True, result_shown: bool = False):
        self.run = run
        # The result's own display repeats the figures (iterations, sub-calls, tokens,
        # cost, time): the final line then says only how the run ended.
        self.result_shown = result_shown
        super().__init__(enabled)

    def _widget_view(self) -> StatusWidget:
        return StatusWidget()

    def line(self, phase: str | None = None, stopped: bool = False, with_text: bool = True) -> str:
        tree = self.run.tree
        usage = tree.ledger.summary()
        calls = f"sub-calls {tree.done + tree.failed} done"
        if tree.in_flight:
            # Once the run has stopped, calls still counted in flight were cancelled.
            calls += f", {tree.in_flight} {'cancelled' if stopped else 'in flight'}"
        if tree.failed:
            calls += f", {tree.failed} failed"
        held = None if phase else hold_message() or slots_message()
        tokens = f"{usage.total.total_tokens:,} tokens"
        if usage.total.cached_input_tokens:
            tokens += (
                f" ({usage.total.cached_input_tokens:,} cached, saved "
                f"{format_saving(usage.total.cache_saved_usd, usage.total.unpriced_savings)})"
            )
        doing = phase or tree.phase
        if not phase and litellm_is_loading():
            doing = f"{doing}: {LOADING_LITELLM}"
        writing = self.partial_text(lines=1, width=60) if with_text and not phase else None
        if writing:
            doing = f"{doing}: …{writing}"
        return " | ".join(
            [
                f"RLM {self.run.model}",
                doing,
                f"iteration {tree.iteration}/{tree.max_iterations or self.run.max_iterations}",
                calls,
                *([held] if held else []),
                tokens,
                format_cost(usage.cost_usd, usage.total.unpriced_calls),
                f"{self.elapsed_s:.1f}s",
            ]
        )

    def compact_line(self) -> str:
        return self.line(with_text=False)

    def partial_text(self, lines: int = 12, width: int = 160) -> str | None:
        """The end of the root turn streaming in now, if any: the model's text, its
        control characters visible (shown, not obeyed, by a terminal)."""
        turn = self.run.tree.live_turn
        return visible(turn.tail(lines, width)) if turn is not None else None

    def final_line(self, exc_type) -> str:
        result = self.run.result
        if exc_type is not None:
            phase = "interrupted" if not issubclass(exc_type, Exception) else "failed"
        else:
            phase = "done" if result.success else (result.stop_reason or "failed")
            shown = self.result_shown and (
                result.success or result.final_answer is not None or result.trajectory
            )
            if shown and not isinstance(self._view, TextLine):
                # (A terminal shows the result as one repr line, without the figures.)
                return f"RLM {self.run.model} | {phase}"
        return self.line(phase, stopped=True)


# -- views -------------------------------------------------------------------------------


class _WidgetOutput:
    """A widget displayed with a text/plain line of our own beside it (ipywidgets' own
    is its repr, e.g. ``HBox(children=(IntProgress(...``), under a display id, so the
    line can be rewritten when the work ends."""

    def __init__(self, widget, text: str):
        from IPython.display import display

        self.widget = widget
        self.handle = display(self._bundle(text), raw=True, display_id=True)

    def _bundle(self, text: str) -> dict:
        bundle = dict(self.widget._repr_mimebundle_() or {})
        bundle["text/plain"] = text
        return bundle

    def settle(self, text: str) -> None:
        self.handle.update(self._bundle(text), raw=True)


class BarWidget:
    """An ipywidgets progress bar with a status line beside it; when the batch ends the
    bar goes and the line stays, as a one-line summary."""

    def show(self, progress: BatchProgress) -> None:
        import ipywidgets as widgets

        self.bar = widgets.IntProgress(
            value=0,
            min=0,
            max=max(progress.total, 1),
            description=progress.label,
            bar_style="info",
            style={"description_width": "initial"},
        )
        self.status = widgets.HTML()
        self.box = widgets.HBox([self.bar, self.status])
        self.update(progress)
        self.output = _WidgetOutput(self.box, progress.line())

    def update(self, progress: BatchProgress) -> None:
        with self.bar.hold_sync(), self.status.hold_sync():
            self.bar.value = progress.done + progress.failed
            if progress.failed:
                self.bar.bar_style = "warning"
            self.status.value = _code(progress.line().split(": ", 1)[1])

    def finish(self, progress: BatchProgress, line: str) -> None:
        with self.bar.hold_sync(), self.status.hold_sync():
            self.bar.value = progress.done + progress.failed
            self.bar.layout.display = "none"
            self.status.value = _code(line)
        self.output.settle(line)


class StatusWidget:
    """One HTML line, rewritten in place."""

    def show(self, status: RunStatus) -> None:
        import ipywidgets as widgets

        self.html = widgets.HTML()
        self.update(status)
        self.output = _WidgetOutput(self.html, status.line())

    def update(self, status: RunStatus) -> None:
        self._set(status.line(with_text=False), status.partial_text())

    def finish(self, status: RunStatus, line: str) -> None:
        self._set(line)
        self.output.settle(line)

    def _set(self, line: str, partial: str | None = None) -> None:
        value = _code(line)
        if partial:  # the root turn as it streams in, under the line
            value += (
                f"<pre class='rlm-live-turn' style='margin:2px 0;opacity:.75'>"
                f"{html.escape(partial)}</pre>"
            )
        if self.html.value != value:
            self.html.value = value


def _code(text: str) -> str:
    return f"<code>{html.escape(text)}</code>"


class TextLine:
    """A status line on stderr, rewritten in place, for terminals and scripts. Only
    elapsed time changing rewrites it at most once a second.

    A line longer than the terminal is wide wraps, and ``\r`` then returns only to the
    start of its last row: every rewrite would leave the rows above behind (nine lines a
    ``%%rlm`` cell at 80 columns). So each line rewritten is cut to the width less one
    column; the summary that ends it is not (nothing rewrites it).
    """

    def __init__(self, stream=None):
        self.stream = stream or sys.stderr
        self._last = ""
        self._written_at = 0.0

    def show(self, display: _LiveDisplay) -> None:
        self._write(self._line_for(display))

    def update(self, display: _LiveDisplay) -> None:
        line = one_line(self._line_for(display))  # (as written: compared with what was)
        news = line.rsplit(" | ", 1)[0] != self._last_full.rsplit(" | ", 1)[0]
        if news or time.perf_counter() - self._written_at >= 1:
            self._write(line)

    def finish(self, display: _LiveDisplay, line: str) -> None:
        self._write(line, end="\n")

    _last_full = ""

    def _line_for(self, display: _LiveDisplay) -> str:
        """The display's line, or, where that is wider than the terminal, its line
        without the text streaming in (the figures matter more than the model's words)."""
        line = display.line()
        if width(one_line(line)) < terminal_columns(self.stream):
            return line
        return display.compact_line()

    def _write(self, line: str, end: str = "") -> None:
        # Whatever is in the line, only our own "\r" and "\n" act on the terminal.
        full = one_line(line)
        # A last line may wrap: nothing rewrites it, so no row of it is left behind.
        line = full if end else fit(full, terminal_columns(self.stream) - 1)
        try:
            # Spaces over what is left of a longer line before.
            self.stream.write("\r" + line + " " * max(0, width(self._last) - width(line)) + end)
            self.stream.flush()
        except (ValueError, OSError):
            pass  # stderr closed or gone (a test's capture, a detached script): the work goes on
        self._last, self._last_full, self._written_at = line, full, time.perf_counter()


def terminal_columns(stream=None) -> int:
    """How wide the terminal showing ``stream`` is.

    A terminal's own width, read at each write (so a resize is followed); in a kernel,
    the width of the terminal its stderr was before ipykernel captured it: jupyter
    console starts its kernel on its own terminal (measured: ipykernel keeps a copy of
    that descriptor, ``_original_stdstream_copy``). Otherwise (a kernel started
    elsewhere, a file) ``$COLUMNS``, else 80, the width terminals open at.
    """
    stream = stream if stream is not None else sys.stderr
    descriptors = [_fileno(stream), getattr(stream, "_original_stdstream_copy", None)]
    if stream is sys.stderr:  # a kernel's: where ipykernel captures none (under pytest)
        descriptors.append(_fileno(sys.__stderr__))
    for descriptor in descriptors:
        try:
            if descriptor is not None and os.isatty(descriptor):
                return max(os.get_terminal_size(descriptor).columns, 20)
        except (TypeError, ValueError, OSError):
            pass  # closed, or no descriptor: try the next way
    try:
        return max(int(os.environ.get("COLUMNS", "")), 20)
    except ValueError:
        return 80


def _fileno(stream) -> int | None:
    try:
        return int(stream.fileno())
    except (AttributeError, ValueError, OSError):
        return None  # not a file (a StringIO, ipykernel's stream)
