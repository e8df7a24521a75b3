"""Per-run capture of stdout/stderr that works for concurrent runs.

``contextlib.redirect_stdout`` swaps the process-wide ``sys.stdout``: two concurrent
runs would mix their output and leak it into the cell. Instead ``sys.stdout`` is
replaced, while any run is active, by a router that writes to the buffer named by a
``ContextVar``. Tasks and the REPL's worker threads inherit the context of the run
that started them, so each run's prints land in its own buffer; everything else goes
to the stream that was there before.

Plain threads do not inherit a context before Python 3.14, so threads the model's code
starts would print into the notebook cell. While routing is installed, a thread started
from a capturing context runs in a copy of it (what 3.14's ``thread_inherit_context``
does).
"""

from __future__ import annotations

import contextlib
import contextvars
import io
import sys
import threading
from collections.abc import Iterable, Iterator
from typing import Any, TextIO, cast

_target: contextvars.ContextVar[io.TextIOBase | None] = contextvars.ContextVar(
    "rlm_capture_target", default=None
)
_lock = threading.Lock()
_active = 0
_saved: tuple[Any, ...] = ()
_thread_start = threading.Thread.start


class _StreamRouter(io.TextIOBase):
    def __init__(self, fallback: TextIO):
        self._fallback = fallback

    def _stream(self) -> TextIO | io.TextIOBase:
        target = _target.get()
        return self._fallback if target is None else target

    def write(self, text: str) -> int:
        return self._stream().write(text)

    # (typeshed's IOBase takes bytes-like lines; a text stream's are str)
    def writelines(self, lines: Iterable[str]) -> None:  # type: ignore[override]
        for line in lines:
            self.write(line)

    def flush(self) -> None:
        stream = self._stream()
        if hasattr(stream, "flush"):
            stream.flush()

    def close(self) -> None:
        pass  # the router owns neither stream; closing it (as GC does) must not close them

    def isatty(self) -> bool:
        isatty = getattr(self._fallback, "isatty", lambda: False)
        return _target.get() is None and bool(isatty())

    def fileno(self) -> int:
        return self._fallback.fileno()

    # typeshed declares TextIOBase.encoding a writable attribute; CPython's is read-only.
    @property
    def encoding(self) -> str:  # type: ignore[override]
        encoding: str = getattr(self._fallback, "encoding", "utf-8")
        return encoding

    def __getattr__(self, name: str) -> Any:
        return getattr(self._fallback, name)


def _start_in_starters_context(thread: threading.Thread) -> None:
    if _target.get() is not None:
        context, run = contextvars.copy_context(), thread.run
        cast(Any, thread).run = lambda: context.run(run)  # (mypy forbids assigning a method)
    return _thread_start(thread)


@contextlib.contextmanager
def routing_installed() -> Iterator[None]:
    """Keep the router in place while at least one run needs it."""
    global _active, _saved
    with _lock:
        if _active == 0:
            _saved = (sys.stdout, sys.stderr)
            sys.stdout, sys.stderr = _StreamRouter(sys.stdout), _StreamRouter(sys.stderr)
            # Patched on purpose (mypy forbids assigning to a method, hence the casts).
            cast(Any, threading.Thread).start = _start_in_starters_context
        _active += 1
    try:
        yield
    finally:
        with _lock:
            _active -= 1
            if _active == 0:
                sys.stdout, sys.stderr = _saved
                cast(Any, threading.Thread).start = _thread_start
                _saved = ()


class OutputSink(io.TextIOBase):
    """A REPL's output: the buffer of its running step. Threads the model's code starts
    keep the sink they were started under, not one step's buffer, so a thread pool made
    in one step prints into the later steps that use it."""

    def __init__(self) -> None:
        self.buffer: io.StringIO | None = None

    def write(self, text: str) -> int:
        buffer = self.buffer
        if buffer is not None:
            buffer.write(text)
        return len(text)


@contextlib.contextmanager
def captured_into(buffer: io.TextIOBase) -> Iterator[io.TextIOBase]:
    """Within this context (and tasks/threads started from it) output goes to buffer."""
    token = _target.set(buffer)
    try:
        yield buffer
    finally:
        _target.reset(token)
