"""Live progress for batches: an ipywidgets bar in Jupyter, a text line elsewhere.

Updates are pushed from the kernel's loop (ipywidgets must not be touched from other
threads since ipykernel 7) by a timer at most ``MAX_UPDATES_PER_S`` times a second, so
a fast batch does not flood the frontend with comm messages. Progress never writes
text/plain output, so notebooks stay stable under nbval.
"""

from __future__ import annotations

import asyncio
import html
import sys
import time
from typing import Any

from .usage import format_cost

MAX_UPDATES_PER_S = 4


def widgets_available() -> bool:
    """True inside a Jupyter kernel, where a frontend can render widgets."""
    try:
        from IPython import get_ipython
    except ImportError:
        return False
    shell = get_ipython()
    return shell is not None and getattr(shell, "kernel", None) is not None


class BatchProgress:
    """Counts a batch's items and shows them; also a ``BatchObserver``."""

    def __init__(self, total: int, label: str = "llm_query_batch", *, enabled: bool = True):
        self.total = total
        self.label = label
        self.done = 0
        self.failed = 0
        self.in_flight = 0
        self.input_tokens = 0
        self.output_tokens = 0
        self.cost_usd: float | None = None
        self.started = time.perf_counter()
        self._view = None
        if enabled:
            self._view = WidgetView(self) if widgets_available() else TextView(self)
        self._timer: asyncio.TimerHandle | None = None
        self._dirty = True

    # -- observer ---------------------------------------------------------------------
    def item_started(self, index: int) -> None:
        self.in_flight += 1
        self._changed()

    def item_finished(self, index: int, result: Any) -> None:
        self.in_flight -= 1
        self.done += 1
        completion = getattr(result, "completion", None) or result
        self.input_tokens += getattr(completion, "input_tokens", 0) or 0
        self.output_tokens += getattr(completion, "output_tokens", 0) or 0
        cost = getattr(completion, "cost_usd", None)
        if cost is not None:
            self.cost_usd = (self.cost_usd or 0.0) + cost
        self._changed()

    def item_failed(self, index: int, error: BaseException) -> None:
        self.in_flight -= 1
        self.failed += 1
        self._changed()

    # -- rendering --------------------------------------------------------------------
    @property
    def elapsed_s(self) -> float:
        return time.perf_counter() - self.started

    def summary(self) -> str:
        finished = self.done + self.failed
        parts = [f"{self.label}: {finished}/{self.total} done"]
        if self.failed:
            parts.append(f"{self.failed} failed")
        if self.in_flight:
            parts.append(f"{self.in_flight} in flight")
        parts.append(f"{self.elapsed_s:.1f}s")
        tokens = self.input_tokens + self.output_tokens
        if tokens:
            parts.append(f"{tokens:,} tokens")
            parts.append(format_cost(self.cost_usd, 0 if self.cost_usd is not None else 1))
        return " | ".join(parts)

    def __enter__(self) -> "BatchProgress":
        if self._view is not None:
            self._view.show()
            self._schedule()
        return self

    def __exit__(self, *exc) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._view is not None:
            self._view.finish(interrupted=exc[0] is not None and
                              not issubclass(exc[0], Exception))

    def _changed(self) -> None:
        self._dirty = True

    def _schedule(self) -> None:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return
        self._timer = loop.call_later(1 / MAX_UPDATES_PER_S, self._tick)

    def _tick(self) -> None:
        if self._view is None:
            return
        self._view.update()  # elapsed time moves even when no item finished
        self._dirty = False
        self._schedule()


class WidgetView:
    """An ipywidgets progress bar with a one-line status beside it."""

    def __init__(self, progress: BatchProgress):
        import ipywidgets as widgets

        self.progress = progress
        self.bar = widgets.IntProgress(value=0, min=0, max=max(progress.total, 1),
                                       description=progress.label[:16],
                                       bar_style="info",
                                       style={"description_width": "initial"})
        self.status = widgets.HTML()
        self.box = widgets.HBox([self.bar, self.status])

    def show(self) -> None:
        from IPython.display import display

        self.update()
        display(self.box)

    def update(self) -> None:
        p = self.progress
        with self.bar.hold_sync(), self.status.hold_sync():
            self.bar.value = p.done + p.failed
            if p.failed:
                self.bar.bar_style = "warning"
            self.status.value = html.escape(p.summary().split(": ", 1)[1])

    def finish(self, interrupted: bool = False) -> None:
        p = self.progress
        with self.bar.hold_sync(), self.status.hold_sync():
            self.bar.value = p.done + p.failed
            self.bar.bar_style = ("danger" if interrupted or p.failed == p.total and p.total
                                  else "warning" if p.failed else "success")
            self.bar.layout.display = "none"  # settle into a one-line summary
            note = " (interrupted)" if interrupted else ""
            self.status.value = html.escape(p.summary() + note)


class TextView:
    """A compact status line on stderr, rewritten in place, for terminals and scripts."""

    def __init__(self, progress: BatchProgress, stream=None):
        self.progress = progress
        self.stream = stream or sys.stderr
        self._last = ""

    def show(self) -> None:
        self.update()

    def update(self) -> None:
        line = self.progress.summary()
        if line != self._last:
            self.stream.write("\r" + line.ljust(len(self._last)))
            self.stream.flush()
            self._last = line

    def finish(self, interrupted: bool = False) -> None:
        note = " (interrupted)" if interrupted else ""
        line = self.progress.summary() + note
        self.stream.write("\r" + line.ljust(len(self._last)) + "\n")
        self.stream.flush()


class RunStatus:
    """One live status panel for a ``%%rlm`` run: iteration, what the root model is
    doing, sub-calls done / in flight (children included), tokens, cost, time."""

    def __init__(self, run, *, enabled: bool = True):
        self.run = run
        self.started = time.perf_counter()
        self._view = None
        self._timer: asyncio.TimerHandle | None = None
        if enabled:
            self._view = _RunWidget(self) if widgets_available() else _RunText(self)

    def line(self, final: str | None = None) -> str:
        tree = self.run.tree
        usage = tree.ledger.summary()
        phase = final or tree.phase
        parts = [f"RLM {self.run.model}", phase,
                 f"iteration {tree.iteration}/{tree.max_iterations or self.run.max_iterations}",
                 f"sub-calls {tree.done + tree.failed} done"
                 + (f", {tree.in_flight} in flight" if tree.in_flight else "")
                 + (f", {tree.failed} failed" if tree.failed else ""),
                 f"{usage.total.total_tokens:,} tokens",
                 format_cost(usage.cost_usd, usage.total.unpriced_calls),
                 f"{time.perf_counter() - self.started:.1f}s"]
        return " | ".join(parts)

    def __enter__(self) -> "RunStatus":
        if self._view is not None:
            self._view.show()
            self._schedule()
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if self._timer is not None:
            self._timer.cancel()
        if self._view is not None:
            result = self.run.result
            if exc_type is not None and not issubclass(exc_type, Exception):
                final = "interrupted"
            elif exc_type is not None:
                final = "failed"
            else:
                final = "done" if result.success else (result.stop_reason or "failed")
            self._view.finish(self.line(final))

    def _schedule(self) -> None:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return
        self._timer = loop.call_later(1 / MAX_UPDATES_PER_S, self._tick)

    def _tick(self) -> None:
        self._view.update(self.line())
        self._schedule()


class _RunWidget:
    def __init__(self, status: RunStatus):
        import ipywidgets as widgets

        self.status = status
        self.html = widgets.HTML()

    def show(self) -> None:
        from IPython.display import display

        self.update(self.status.line())
        display(self.html)

    def update(self, line: str) -> None:
        value = f"<code>{html.escape(line)}</code>"
        if self.html.value != value:
            self.html.value = value

    def finish(self, line: str) -> None:
        self.update(line)


class _RunText:
    def __init__(self, status: RunStatus, stream=None):
        self.status = status
        self.stream = stream or sys.stderr
        self._last = ""

    def show(self) -> None:
        self.update(self.status.line())

    def update(self, line: str) -> None:
        # Elapsed time changes every tick; rewrite at most once a second in a terminal.
        if line.rsplit(" | ", 1)[0] != self._last.rsplit(" | ", 1)[0] or \
                time.perf_counter() - getattr(self, "_at", 0) > 1:
            self.stream.write("\r" + line.ljust(len(self._last)))
            self.stream.flush()
            self._last, self._at = line, time.perf_counter()

    def finish(self, line: str) -> None:
        self.stream.write("\r" + line.ljust(len(self._last)) + "\n")
        self.stream.flush()
