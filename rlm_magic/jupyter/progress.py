"""Live progress: a batch's progress bar and a ``%%rlm`` run's status panel.

In a notebook they are ipywidgets; in a terminal (terminal IPython, jupyter console, a
script) one compact text line on stderr, rewritten in place, ending as a summary line.
Updates are pushed from the kernel's loop (widgets must not be touched from other
threads since ipykernel 7) by a timer at most ``MAX_UPDATES_PER_S`` times a second, so a
fast batch does not flood the frontend with comm messages.

Beside every widget view sits a text/plain line, what a viewer without widgets shows
(GitHub, nbviewer, an executed copy from papermill or nbconvert). It is the status as
one line, rewritten with ``update_display_data`` when the work ends, so a saved notebook
shows how the work ended, not how it started. A terminal's last line is fitted to its
width by saying less (``status_line``); the views themselves are in ``progress_views``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from types import TracebackType
from typing import Any, Protocol, TypeVar

from .._terminal_text import visible
from ..llm.litellm_loader import litellm_is_loading
from ..llm.ratelimit import hold_message
from ..llm.slots import hold_message as slots_message
from ..llm.usage import format_cost, format_saving
from ..maps.run_map import MapObserver
from .progress_views import BarWidget, StatusWidget, TextLine, terminal_columns
from .status_line import Part, fitted, joined, short_model

__all__ = [
    "LOADING_LITELLM",
    "MAX_UPDATES_PER_S",
    "BatchProgress",
    "RunStatus",
    "TextLine",  # (the views' own module: progress_views)
    "terminal_columns",
    "from_a_terminal_client",
    "widgets_available",
]

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


def from_a_terminal_client(request: dict[str, Any]) -> bool:
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


_Display = TypeVar("_Display", bound="_LiveDisplay")


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

    def parts(self, *, stopped: bool = False) -> list[Part]:
        """The line's parts, with their shorter forms (see ``status_line``)."""
        raise NotImplementedError

    def final_line(self, exc_type: type[BaseException] | None, columns: int | None = None) -> str:
        """The line the display ends on; fitted to ``columns`` (a terminal's) by saying
        less, where given."""
        interrupted = exc_type is not None and not issubclass(exc_type, Exception)
        parts = self.parts(stopped=True) + (
            [Part("(interrupted)", glued=True)] if interrupted else []
        )
        return fitted(parts, columns) if columns is not None else joined(parts)

    def _widget_view(self) -> _View:
        raise NotImplementedError

    def __enter__(self: _Display) -> _Display:
        view = self._view
        if view is not None:
            view.show(self)
            self._schedule(view)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        view = self._view
        if view is not None:
            # A terminal's last line stays: one wider than the terminal would wrap.
            columns = terminal_columns(view.stream) - 1 if isinstance(view, TextLine) else None
            view.finish(self, self.final_line(exc_type, columns))

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
        """As tqdm shows it: items a second (or seconds an item) over the items this run
        really asked and had answered, and, while it runs, the time left at that pace.
        None before the first such item: answers from disk or the cache and failures
        say nothing of how fast calls go."""
        answered = self.done - self.from_disk - self.cached
        elapsed = self.elapsed_s
        if answered <= 0 or elapsed <= 0:
            return None
        rate = answered / elapsed
        shown = f"{rate:.1f} items/s" if rate >= 1 else f"{1 / rate:.1f} s/item"
        left = self.total - self.done - self.failed - self.unsent
        if stopped or left <= 0:
            return shown
        return f"{shown}, ~{_duration(left / rate)} left"

    def line(self, stopped: bool = False) -> str:
        return joined(self.parts(stopped=stopped))

    def parts(self, *, stopped: bool = False) -> list[Part]:
        done = f"{self.done}/{self.total} done"
        parts = [Part(f"{self.label}: {done}", (done,), rank=3)]
        # Answers from disk and the cache are among those done: said in fewer words,
        # then not at all, in a narrow terminal.
        if self.from_disk:
            kept = f"{self.from_disk} from disk"
            parts.append(Part(kept, (f"{self.from_disk} kept",), dropped_at=2))
        if self.cached:
            cached = f"{self.cached} from the cache"
            parts.append(Part(cached, (f"{self.cached} cached",), dropped_at=2))
        if self.failed:
            parts.append(Part(f"{self.failed} failed"))
        if self.unsent:
            unsent = f"{self.unsent} not sent"
            parts.append(Part(f"{unsent} (cost budget)", (unsent,), rank=0))
        if self.in_flight and not stopped and litellm_is_loading():
            parts.append(Part(LOADING_LITELLM))  # nothing is sent yet: do not look stalled
        elif self.in_flight:
            # Once the batch has stopped, calls still counted in flight were cancelled.
            parts.append(Part(f"{self.in_flight} {'cancelled' if stopped else 'in flight'}"))
        held = None if stopped else (self.hold() if self.hold else None) or slots_message()
        if held:
            parts.append(Part(held, ("",), rank=0))
        pace = self.pace(stopped)
        if pace:
            parts.append(Part(pace, ("",), rank=0))
        # The time and tokens go last of all (the dollars stay): in %rlm usage too.
        parts.append(Part(f"{self.elapsed_s:.1f}s", dropped_at=4))
        tokens = self.input_tokens + self.output_tokens
        if tokens:
            parts.append(Part(f"{tokens:,} tokens", (f"{tokens:,} tok",), dropped_at=4))
            parts.append(Part(format_cost(self.cost_usd)))
        return parts


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

    def __init__(self, run: Any, *, enabled: bool = True, result_shown: bool = False):
        self.run = run
        # The result's own display repeats the figures (iterations, sub-calls, tokens,
        # cost, time): the final line then says only how the run ended.
        self.result_shown = result_shown
        super().__init__(enabled)

    def _widget_view(self) -> StatusWidget:
        return StatusWidget()

    def line(self, phase: str | None = None, stopped: bool = False, with_text: bool = True) -> str:
        return joined(self.parts(phase=phase, stopped=stopped, with_text=with_text))

    def parts(
        self, *, phase: str | None = None, stopped: bool = False, with_text: bool = True
    ) -> list[Part]:
        tree = self.run.tree
        usage = tree.ledger.summary()
        counts = ""
        if tree.in_flight:
            # Once the run has stopped, calls still counted in flight were cancelled.
            counts += f", {tree.in_flight} {'cancelled' if stopped else 'in flight'}"
        if tree.failed:
            counts += f", {tree.failed} failed"
        done = tree.done + tree.failed
        held = None if phase else hold_message() or slots_message()
        total = usage.total
        tokens = f"{total.total_tokens:,} tokens"
        detail = ""
        if total.cached_input_tokens:
            saved = format_saving(total.cache_saved_usd, total.unpriced_savings)
            detail = f"({total.cached_input_tokens:,} cached, saved {saved})"
        doing = phase or tree.phase
        if not phase and litellm_is_loading():
            doing = f"{doing}: {LOADING_LITELLM}"
        writing = self.partial_text(lines=1, width=60) if with_text and not phase else None
        if writing:
            doing = f"{doing}: …{writing}"
        model = str(self.run.model)
        iterations = f"{tree.iteration}/{tree.max_iterations or self.run.max_iterations}"
        return [
            Part(f"RLM {model}", tuple(f"RLM {m}" for m in short_model(model)), 2, name=True),
            Part(doing),
            Part(f"iteration {iterations}", (f"iter {iterations}",)),
            Part(
                f"sub-calls {done} done{counts}",
                (f"{done} sub-calls{counts}", (3, f"{done} calls{counts}")),
            ),
            *([Part(held, ("",), rank=0)] if held else []),
            Part(tokens, (f"{total.total_tokens:,} tok",), dropped_at=4),
            *([Part(detail, ("",), rank=0, glued=True)] if detail else []),
            Part(format_cost(usage.cost_usd, total.unpriced_calls)),
            Part(f"{self.elapsed_s:.1f}s", dropped_at=4),
        ]

    def compact_line(self) -> str:
        return self.line(with_text=False)

    def partial_text(self, lines: int = 12, width: int = 160) -> str | None:
        """The end of the root turn streaming in now, if any: the model's text, its
        control characters visible (shown, not obeyed, by a terminal)."""
        turn = self.run.tree.live_turn
        return visible(turn.tail(lines, width)) if turn is not None else None

    def final_line(self, exc_type: type[BaseException] | None, columns: int | None = None) -> str:
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
        parts = self.parts(phase=phase, stopped=True)
        return fitted(parts, columns) if columns is not None else joined(parts)
