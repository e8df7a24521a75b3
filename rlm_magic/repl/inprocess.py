"""The REPL in which a root model's code runs.

Each step runs in a worker thread of its own, not on the kernel's loop:
- model code may block (``time.sleep``, a CPU loop) without freezing the loop, so
  progress, other runs and the interrupt button keep working, and a stuck step can be
  abandoned at once when it times out or the user interrupts;
- the helpers can then be called *without* ``await`` (real models write that): a plain
  call blocks only the worker thread while its requests run concurrently on the kernel
  loop, where litellm's async clients live.

Code that does use ``await`` runs on a private loop in the worker thread. Helper calls
written as ``await llm_query(...)``, or passed to ``asyncio.gather``/``create_task``,
are rewritten to awaitable variants that are still served on the kernel loop. The
compiling, rewriting and running of a block live in ``steps``, shared with the sandbox.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import ctypes
import io
import itertools
import threading
import time
from collections.abc import Callable, Coroutine, Sequence
from typing import TYPE_CHECKING, Any

from .base import Helpers, KeptREPL, SubCallBudget
from .capture import OutputSink, routing_installed
from .provenance import (
    Replayed,
    Undecidable,
    assigned_names,
    carried_digests,
    replay,
    replaying,
)
from .steps import (
    StepInterrupted,
    StepOutput,
    compile_step,
    execute_step,
    final_var,
    install_helpers,
    prepare_step,
    step_filename,
    user_variables,
)

_step_ids = itertools.count(1)


class _Step:
    """One running block: its threads (its own, and any the model's code started that
    called a helper), its requests in flight, and whether it was stopped. A stopped step
    stays stopped: its threads may still be unwinding."""

    def __init__(self, step_id: int):
        self.id = step_id
        self.thread: threading.Thread | None = None
        self.threads: set[threading.Thread] = set()
        self.stopped = False  # timed out, interrupted or closed: no more calls
        self.finished = False  # its own thread has left the model's code
        self.killing = False  # a kill chain is running
        self.pending: set[concurrent.futures.Future[Any]] = set()


class AsyncREPL:
    """A persistent namespace plus a way to run code blocks in it.

    ``helpers`` maps names to coroutine functions; they are served on ``loop`` (the
    kernel's) and exposed to model code both as blocking functions and, through the
    rewrite above, as awaitables.
    """

    # A stopped step's threads are hit with StepInterrupted this often (model code may
    # swallow it with a bare `except:`) for at most this long (a thread blocked in C,
    # e.g. on a socket, cannot take it at all; its calls are refused meanwhile).
    KILL_INTERVAL_S = 0.1
    KILL_FOR_S = 10.0

    def __init__(
        self,
        namespace: dict[str, Any],
        helpers: Helpers,
        loop: asyncio.AbstractEventLoop | None = None,
    ):
        self.namespace = namespace
        self.loop = loop or asyncio.get_running_loop()
        self.helper_names = set(helpers)
        self._lock = threading.Lock()
        self._threads: dict[int, _Step] = {}  # thread ident -> the step it works for
        self._current: _Step | None = None
        self._closed = False
        self.last_output: StepOutput | None = None
        # No sandbox, so no isolation to report (the REPL interface's attributes).
        self.isolation: dict[str, Any] | None = None
        self.network_isolated: bool | None = None
        self._sink = OutputSink()
        self._carried: dict[str, Any] = {}  # ``mark_carried``
        install_helpers(
            namespace,
            list(helpers),
            self._submit_call,
            refuse=lambda: _on_loop_thread(self.loop),
            templates=helpers,
        )
        self._helpers = helpers

    # -- serving helpers from the worker threads ---------------------------------------
    def _step_of_caller(self) -> _Step | None:
        """The step the calling thread works for (called with the lock held). A thread
        the model's code started (a ThreadPoolExecutor's) joins the running step on its
        first call; a thread of a stopped step stays with it, and is refused."""
        thread, ident = threading.current_thread(), threading.get_ident()
        step = self._threads.get(ident)
        if step is None or (step.finished and not step.stopped):
            step = self._current
            if step is not None:
                self._threads[ident] = step
                step.threads.add(thread)
        return step

    def _submit(self, coro: Coroutine[Any, Any, Any]) -> concurrent.futures.Future[Any]:
        if replaying():  # a helper the model's code kept under another name: no real call
            coro.close()
            raise Undecidable("a replay makes no sub-call")
        with self._lock:
            step = self._step_of_caller()
            if self._closed or step is None or step.stopped:
                coro.close()
                raise StepInterrupted("this step was stopped; no request was sent")
            # Scheduled under the lock, so a concurrent stop cannot miss this call.
            future = asyncio.run_coroutine_threadsafe(coro, self.loop)
            step.pending.add(future)
        future.add_done_callback(step.pending.discard)
        return future

    def _submit_call(
        self, name: str, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> concurrent.futures.Future[Any]:
        return self._submit(self._helpers[name](*args, **kwargs))

    # -- running steps ----------------------------------------------------------------
    async def run(self, code: str, timeout: float | None = None) -> StepOutput:
        """Run one block; never raises for errors in the code itself. If cancelled, it
        stops the step's threads and re-raises; ``last_output`` then holds what the step
        printed before it was stopped."""
        if self._closed:
            raise RuntimeError("this REPL is closed")
        step = _Step(next(_step_ids))
        output = self.last_output = StepOutput(code=code)
        buffer = io.StringIO()
        started = time.perf_counter()
        compiled = prepare_step(code, self.helper_names, step_filename(step.id), output)
        if compiled is None:
            return output

        done: asyncio.Future[None] = self.loop.create_future()
        step.thread = threading.Thread(
            target=self._execute,
            name=f"rlm-step-{step.id}",
            args=(
                step,
                lambda: execute_step(compiled, self.namespace, output, buffer, self._sink),
                done,
            ),
            daemon=True,
        )
        self._current = step
        try:
            with routing_installed():
                step.thread.start()
                try:
                    await asyncio.wait_for(asyncio.shield(done), timeout)
                except asyncio.TimeoutError:
                    self._stop(step)
                    # Give the thread a moment to unwind so its last output is kept.
                    await asyncio.wait([done], timeout=0.5)
                    output.timed_out = True
                    output.error = (
                        f"TimeoutError: this step ran longer than {timeout:g}s and was stopped"
                    )
                except BaseException:
                    self._stop(step)
                    output.error = "KeyboardInterrupt: the run was interrupted"
                    raise
        finally:
            self._current = None
            output.stdout = buffer.getvalue()
            output.elapsed_s = time.perf_counter() - started
            for name in assigned_names(code) if self._carried else ():
                self._carried.pop(name, None)  # this question's variable now
        return output

    async def replay(
        self,
        codes: Sequence[str],
        variable: str | None = None,
        timeout: float = 10.0,
        answer: str | None = None,
    ) -> Replayed:
        """The reply's blocks run again with the data changed (``provenance``), in a
        thread of their own stopped like a step's when ``timeout`` is up."""
        found = Replayed()

        def work() -> None:
            nonlocal found
            found = replay(
                codes,
                self.namespace,
                self.helper_names,
                compile_step,
                variable=variable,
                answer=answer,
            )

        step = _Step(next(_step_ids))
        done: asyncio.Future[None] = self.loop.create_future()
        step.thread = threading.Thread(
            target=self._execute, name=f"rlm-replay-{step.id}", args=(step, work, done), daemon=True
        )
        with routing_installed():
            step.thread.start()
            try:
                await asyncio.wait_for(asyncio.shield(done), timeout)
            except asyncio.TimeoutError:
                self._stop(step)
                return Replayed()
            except BaseException:
                self._stop(step)
                raise
        return found

    def _execute(self, step: _Step, work: Callable[[], None], done: asyncio.Future[None]) -> None:
        ident = threading.get_ident()
        try:
            with self._lock:
                self._threads[ident] = step
                step.threads.add(threading.current_thread())
            work()
        except StepInterrupted:
            pass  # a kill landing just outside the model's code
        finally:
            self._leave(step, ident)
            try:
                self.loop.call_soon_threadsafe(_resolve, done)
            except RuntimeError:
                pass  # the loop is gone (kernel shutting down)

    def _leave(self, step: _Step, ident: int) -> None:
        """Mark the step's own thread finished. Kills are injected only under the lock
        and only into unfinished threads, so once this returns none can arrive; one that
        was pending is cleared here, and one landing before the lock is retried."""
        while True:
            try:
                with self._lock:
                    step.finished = True
                    if self._threads.get(ident) is step:
                        del self._threads[ident]
                    ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(ident), None)
                return
            except StepInterrupted:
                continue

    def _stop(self, step: _Step) -> None:
        """Stop a step: refuse its further helper calls, cancel those in flight, and
        raise ``StepInterrupted`` in its threads, again and again, until they are gone."""
        with self._lock:
            step.stopped = True
            pending = list(step.pending)
            start_chain = not step.killing
            step.killing = True
        for future in pending:
            future.cancel()
        if start_chain:
            _kill_chain(
                self.loop,
                self._lock,
                step,
                time.monotonic() + self.KILL_FOR_S,
                self.KILL_INTERVAL_S,
            )

    # -- what the run reads (async, like the sandbox's, which has to ask) ---------
    async def final_var(self, name: str) -> str | None:
        return final_var(self.namespace, name)

    async def set_variable(self, name: str, value: Any) -> None:
        self.namespace[name] = value

    def mark_carried(self) -> None:
        """A session's next question begins: what the model's variables hold now is
        data of the earlier questions, not this one's work."""
        self._carried = {name: self.namespace[name] for name in user_variables(self.namespace)}

    async def still_carried(self) -> dict[str, str | None]:
        return carried_digests(self.namespace, self._carried)

    async def set_context(self, value: Any, names: list[str]) -> None:
        for name in names:
            self.namespace[name] = value

    def rebind(self, helpers: Helpers, budget: SubCallBudget) -> None:
        """Serve the helpers of the next run (a session's REPL outlives its runs). Its
        budget is the helpers' own to keep (a sandbox cuts batches to it early)."""
        self._helpers = helpers

    async def variable_names(self) -> list[str]:
        return user_variables(self.namespace)

    async def variables(self, timeout: float = 5.0) -> dict[str, Any]:
        """The model's variables, as they are (in-process, nothing has to cross)."""
        return {name: self.namespace[name] for name in user_variables(self.namespace)}

    async def aclose(self) -> None:
        self.close()

    def close(self) -> None:
        """End the REPL: stop any step still running; no helper call is served again."""
        with self._lock:
            self._closed = True
            steps = {step for step in self._threads.values() if not step.finished}
        for step in steps:
            self._stop(step)


def _kill_chain(
    loop: asyncio.AbstractEventLoop,
    lock: threading.Lock,
    step: _Step,
    deadline: float,
    interval: float,
) -> None:
    """Inject StepInterrupted into the step's live threads, then come back. Holds only
    the step (not the REPL and its namespace), and ends by the deadline."""
    alive = False
    with lock:  # a step thread marks itself finished under this lock: no late kill
        for thread in step.threads:
            if thread is step.thread and step.finished:
                continue
            if thread.is_alive() and thread.ident is not None:
                alive = True
                ctypes.pythonapi.PyThreadState_SetAsyncExc(
                    ctypes.c_ulong(thread.ident), ctypes.py_object(StepInterrupted)
                )
    if alive and time.monotonic() < deadline:
        try:
            loop.call_later(interval, _kill_chain, loop, lock, step, deadline, interval)
        except RuntimeError:
            pass  # the loop is closed


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


def _on_loop_thread(loop: asyncio.AbstractEventLoop) -> bool:
    try:
        return asyncio.get_running_loop() is loop
    except RuntimeError:
        return False


if TYPE_CHECKING:
    _: type[KeptREPL] = AsyncREPL  # mypy checks that it has the interface a session keeps
