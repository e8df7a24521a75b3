"""How live progress shows itself: ipywidgets in a notebook (a bar, a status line), each
with a text/plain line beside it for viewers without widgets; in a terminal, a text line
on stderr rewritten in place (``TextLine``), as wide as the terminal (``terminal_columns``).
What is shown comes from the displays in ``progress``."""

from __future__ import annotations

import html
import os
import sys
import time
from typing import Any, Protocol, TextIO

from .._terminal_text import fit, one_line, width


class _Lined(Protocol):
    """A display as a text line shows it (``progress``'s displays)."""

    def line(self) -> str: ...

    def compact_line(self) -> str: ...


class _Counted(Protocol):
    """A batch as its bar shows it (``progress.BatchProgress``)."""

    total: int
    label: str
    done: int
    failed: int

    def line(self) -> str: ...


class _Status(Protocol):
    """A run as its status line shows it (``progress.RunStatus``)."""

    def line(self, *, with_text: bool = ...) -> str: ...

    def partial_text(self) -> str | None: ...


class _WidgetOutput:
    """A widget displayed with a text/plain line of our own beside it (ipywidgets' own
    is its repr, e.g. ``HBox(children=(IntProgress(...``), under a display id, so the
    line can be rewritten when the work ends."""

    def __init__(self, widget: Any, text: str):
        from IPython.display import display

        self.widget = widget
        self.handle = display(self._bundle(text), raw=True, display_id=True)

    def _bundle(self, text: str) -> dict[str, Any]:
        bundle = dict(self.widget._repr_mimebundle_() or {})
        bundle["text/plain"] = text
        return bundle

    def settle(self, text: str) -> None:
        self.handle.update(self._bundle(text), raw=True)


class BarWidget:
    """An ipywidgets progress bar with a status line beside it; when the batch ends the
    bar goes and the line stays, as a one-line summary."""

    def show(self, progress: _Counted) -> None:
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

    def update(self, progress: _Counted) -> None:
        with self.bar.hold_sync(), self.status.hold_sync():
            self.bar.value = progress.done + progress.failed
            if progress.failed:
                self.bar.bar_style = "warning"
            self.status.value = _code(progress.line().split(": ", 1)[1])

    def finish(self, progress: _Counted, line: str) -> None:
        with self.bar.hold_sync(), self.status.hold_sync():
            self.bar.value = progress.done + progress.failed
            self.bar.layout.display = "none"
            self.status.value = _code(line)
        self.output.settle(line)


class StatusWidget:
    """One HTML line, rewritten in place."""

    def show(self, status: _Status) -> None:
        import ipywidgets as widgets

        self.html = widgets.HTML()
        self.update(status)
        self.output = _WidgetOutput(self.html, status.line())

    def update(self, status: _Status) -> None:
        self._set(status.line(with_text=False), status.partial_text())

    def finish(self, status: _Status, line: str) -> None:
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

    def __init__(self, stream: TextIO | None = None) -> None:
        self.stream = stream or sys.stderr
        self._last = ""
        self._written_at = 0.0

    def show(self, display: _Lined) -> None:
        self._write(self._line_for(display))

    def update(self, display: _Lined) -> None:
        line = one_line(self._line_for(display))  # (as written: compared with what was)
        news = line.rsplit(" | ", 1)[0] != self._last_full.rsplit(" | ", 1)[0]
        if news or time.perf_counter() - self._written_at >= 1:
            self._write(line)

    def finish(self, display: _Lined, line: str) -> None:
        self._write(line, end="\n")

    _last_full = ""

    def _line_for(self, display: _Lined) -> str:
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


def terminal_columns(stream: Any = None) -> int:
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


def _fileno(stream: Any) -> int | None:
    try:
        return int(stream.fileno())
    except (AttributeError, ValueError, OSError):
        return None  # not a file (a StringIO, ipykernel's stream)
