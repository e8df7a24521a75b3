"""Interrupts that stop a cell at once.

ipykernel's own SIGINT handler for async cells schedules its cancellation with
``call_soon``, which does not wake a loop asleep in ``select()``: the interrupt lands
only when a timer fires, often seconds later (ipykernel issue 881). While rlm-magic
work is running, this module's handler replaces it and cancels that work with
``call_soon_threadsafe``, which wakes the loop at once. Model code runs in a sandbox
process or in worker threads (see ``repl``), never on the main thread, so the main
thread is always free to take the signal, even when the model's code blocks. The previous
handler is restored when the work ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import itertools
import signal
import threading
from collections.abc import Awaitable
from typing import TYPE_CHECKING, Any, TypeVar

from ..errors import interrupt
from ..llm.completion import Completion, partial_answer

if TYPE_CHECKING:
    from types import FrameType

T = TypeVar("T")

_guarded: dict[asyncio.Task[Any], tuple[asyncio.AbstractEventLoop, int | None]] = {}
_interrupted: set[asyncio.Task[Any]] = set()
_previous_handler = None

# Which cell started a piece of work: set when a cell starts (IPython's pre_run_cell
# event) in the context its code runs in, so tasks the cell creates inherit it. An
# interrupt stops only the work of the cell that is running, not another cell's
# background batch.
_cell: contextvars.ContextVar[int | None] = contextvars.ContextVar("rlm_magic_cell", default=None)
_running_cell: int | None = None
_cell_numbers = itertools.count(1)


def cell_started(info: object = None) -> None:
    """IPython ``pre_run_cell`` hook (registered by the extension)."""
    global _running_cell
    _running_cell = next(_cell_numbers)
    _cell.set(_running_cell)


def cell_ended(result: object = None) -> None:
    """IPython ``post_run_cell`` hook (registered by the extension)."""
    global _running_cell
    _running_cell = None


def _handle_sigint(signum: int, frame: FrameType | None) -> None:
    for task, (loop, cell) in list(_guarded.items()):
        if _running_cell is not None and cell != _running_cell:
            continue  # another cell's work, running in the background: not interrupted
        _interrupted.add(task)
        try:
            loop.call_soon_threadsafe(task.cancel)
        except RuntimeError:
            pass  # that loop is closed: its task is not running any more
    # Also let the kernel's own handler stop the cell: our work may run in a background
    # task while the cell awaits something else. Its callback is scheduled with
    # call_soon, and runs at once because the call_soon_threadsafe above woke the loop.
    # (Python's default handler would raise KeyboardInterrupt into the event loop.)
    if callable(_previous_handler) and _previous_handler is not signal.default_int_handler:
        _previous_handler(signum, frame)


def _install(task: asyncio.Task[Any], loop: asyncio.AbstractEventLoop) -> bool:
    global _previous_handler
    if threading.current_thread() is not threading.main_thread():
        return False  # signals reach the main thread only
    if signal.getsignal(signal.SIGINT) is not _handle_sigint:
        # First guarded task, or a new cell's kernel handler now sits on top of ours:
        # take SIGINT (back), forwarding to whatever handler is current.
        _previous_handler = signal.signal(signal.SIGINT, _handle_sigint)
    _guarded[task] = (loop, _cell.get())
    return True


def _uninstall(task: asyncio.Task[Any]) -> None:
    global _previous_handler
    _guarded.pop(task, None)
    _interrupted.discard(task)
    if not _guarded and _previous_handler is not None:
        # Restore only our own replacement: if a later cell's kernel handler sits on
        # top of ours, putting back the older one would make that cell uninterruptible.
        if signal.getsignal(signal.SIGINT) is _handle_sigint:
            signal.signal(signal.SIGINT, _previous_handler)
            _previous_handler = None


async def run_interruptibly(awaitable: Awaitable[T], name: str = "the work") -> T:
    """Await ``awaitable`` in a task of its own that SIGINT cancels promptly; an
    interrupt then surfaces here as KeyboardInterrupt ("<name> interrupted"), as it
    would in sync code."""
    loop = asyncio.get_running_loop()
    arrived = _Arrived()
    task = asyncio.ensure_future(arrived.kept_from(awaitable))
    installed = _install(task, loop)
    try:
        try:
            return await asyncio.shield(task)
        except asyncio.CancelledError:
            # Either SIGINT cancelled the task, or our caller was cancelled: in both
            # cases the work must stop, and be awaited so nothing is left running.
            task.cancel()
            with contextlib.suppress(BaseException):  # it was cancelled on purpose
                await task
            cut = arrived.completion
            if task in _interrupted:
                if _keyboard_interrupt_is_safe():
                    stop = interrupt(f"{name} interrupted")
                    # What a single call had received rides on, as on its cancellation.
                    stop.partial_answer = cut  # type: ignore[attr-defined]
                    raise stop from None
                # In a task of its own (asyncio.gather / create_task in a cell), a
                # KeyboardInterrupt would escape the event loop and wedge the kernel.
                raise asyncio.CancelledError from None
            raise
    finally:
        if installed:
            _uninstall(task)


class _Arrived:
    """What a single call had received when it was cancelled, read inside its task.

    Across a task's edge the cancellation may not be the one the call raised (awaiting a
    cancelled task, Python 3.10 raises a new ``CancelledError``), so what rode on it
    is taken before it crosses.
    """

    completion: Completion | None = None

    async def kept_from(self, awaitable: Awaitable[T]) -> T:
        try:
            return await awaitable
        except asyncio.CancelledError as cancel:
            self.completion = partial_answer(cancel)
            raise


def _keyboard_interrupt_is_safe() -> bool:
    """True unless we run in IPython outside the cell's own stack: there, only
    IPython's ``run_code`` catches a KeyboardInterrupt before asyncio's Task does."""
    import sys

    shell_module = sys.modules.get("IPython.core.interactiveshell")
    if shell_module is None or shell_module.InteractiveShell.initialized() is False:
        return True
    run_code = shell_module.InteractiveShell.run_code.__code__
    frame: FrameType | None = sys._getframe(1)
    while frame is not None:
        if frame.f_code is run_code:
            return True
        frame = frame.f_back
    return False
