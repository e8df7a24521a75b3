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
are rewritten to awaitable variants that are still served on the kernel loop.
"""

from __future__ import annotations

import ast
import asyncio
import builtins
import concurrent.futures
import ctypes
import inspect
import io
import itertools
import linecache
import threading
import time
import traceback
from dataclasses import dataclass
from typing import Any, Awaitable, Callable

from .capture import captured_into, routing_installed

_ASYNC_TABLE = "__rlm_async__"
_LAST_VALUE = "__rlm_last__"
# asyncio functions whose arguments model code means to run concurrently. Matched as
# `asyncio.X(...)` or a name imported from asyncio, so concurrent.futures.wait & co.
# (thread-pool code, which wants the blocking helpers) are left alone. `create_task` is
# also matched as a method (a loop's or a TaskGroup's).
_SCHEDULERS = {"gather", "create_task", "ensure_future", "wait", "wait_for", "as_completed",
               "shield"}
_step_ids = itertools.count(1)


class StepInterrupted(BaseException):
    """Raised inside a step's thread to stop it (timeout or user interrupt).

    A BaseException, so model code's ``except Exception`` does not swallow it."""


@dataclass
class StepOutput:
    """What one code block did."""

    code: str
    stdout: str = ""
    error: str | None = None  # formatted traceback, when the block raised
    value: str | None = None  # repr of the last expression, when not None
    elapsed_s: float = 0.0
    timed_out: bool = False

    def as_text(self) -> str:
        parts = [self.stdout.rstrip("\n")] if self.stdout else []
        if self.value is not None:
            parts.append(self.value)
        if self.error:
            parts.append(self.error.rstrip("\n"))
        return "\n".join(parts) if parts else "(no output)"


def step_filename(step_id: int) -> str:
    """The file name model code is compiled under; also how the interrupt handler
    recognises a model frame."""
    return f"<rlm-step-{step_id}>"


def is_step_filename(filename: str) -> bool:
    return filename.startswith("<rlm-step-")


class _HelperCallRewriter(ast.NodeTransformer):
    """Route awaited or scheduled helper calls to the awaitable variants: calls under
    ``await``, in the arguments of ``asyncio.gather``/``create_task``/..., and in a list
    later handed to one (``coros = [llm_query(p) for p in ps]; await gather(*coros)``).
    Code inside a ``lambda`` or a plain ``def`` runs synchronously: it keeps the
    blocking helpers."""

    def __init__(self, names: set[str]):
        self.names = names
        self.asyncio_names = {"asyncio"}  # the module, under any alias
        self.imported: set[str] = set()  # schedulers imported from asyncio
        self.scheduled: set[str] = set()  # variables passed to a scheduler

    def visit_Module(self, node: ast.Module):
        for inner in ast.walk(node):
            if isinstance(inner, ast.Import):
                self.asyncio_names |= {a.asname or a.name for a in inner.names
                                       if a.name == "asyncio"}
            elif isinstance(inner, ast.ImportFrom) and inner.module == "asyncio":
                self.imported |= {a.asname or a.name for a in inner.names
                                  if a.name in _SCHEDULERS}
        for inner in ast.walk(node):
            if isinstance(inner, ast.Call) and self._is_scheduler(inner):
                for arg in _arguments(inner):
                    self.scheduled |= {leaf.id for leaf in ast.walk(arg)
                                       if isinstance(leaf, ast.Name)}
        self.generic_visit(node)
        return node

    def _is_scheduler(self, call: ast.Call) -> bool:
        func = call.func
        if isinstance(func, ast.Name):
            return func.id in self.imported
        if isinstance(func, ast.Attribute) and func.attr in _SCHEDULERS:
            base = func.value
            return func.attr == "create_task" or (
                isinstance(base, ast.Name) and base.id in self.asyncio_names)
        return False

    def _is_helper_call(self, node) -> bool:
        return (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                and node.func.id in self.names)

    def _to_async(self, call: ast.Call) -> None:
        call.func = ast.copy_location(ast.Subscript(
            value=ast.Name(id=_ASYNC_TABLE, ctx=ast.Load()),
            slice=ast.Constant(value=call.func.id), ctx=ast.Load()), call.func)

    def _all_to_async(self, tree) -> None:
        for inner in _walk_same_scope(tree):
            if self._is_helper_call(inner):
                self._to_async(inner)

    def visit_Await(self, node: ast.Await):
        self.generic_visit(node)
        if self._is_helper_call(node.value):
            self._to_async(node.value)
        return node

    def visit_Call(self, node: ast.Call):
        self.generic_visit(node)
        if self._is_scheduler(node):
            for arg in _arguments(node):
                self._all_to_async(arg)
        elif (isinstance(node.func, ast.Attribute) and node.func.attr in ("append", "extend")
              and isinstance(node.func.value, ast.Name)
              and node.func.value.id in self.scheduled):
            for arg in node.args:
                self._all_to_async(arg)
        return node

    def visit_Assign(self, node: ast.Assign):
        self.generic_visit(node)
        if any(isinstance(t, ast.Name) and t.id in self.scheduled for t in node.targets):
            self._all_to_async(node.value)
        return node


def _arguments(call: ast.Call) -> list[ast.AST]:
    return [*call.args, *(keyword.value for keyword in call.keywords)]


def _walk_same_scope(tree):
    """ast.walk, without descending into lambdas and plain (synchronous) functions."""
    pending = [tree]
    while pending:
        node = pending.pop()
        yield node
        for child in ast.iter_child_nodes(node):
            if not isinstance(child, (ast.Lambda, ast.FunctionDef)):
                pending.append(child)


def compile_step(code: str, helper_names: set[str], filename: str):
    """Parse, rewrite and compile a block; the last expression's value is kept."""
    # Registered so tracebacks can quote the model's lines.
    linecache.cache[filename] = (len(code), None, code.splitlines(True), filename)
    tree = ast.parse(code, filename=filename, mode="exec")
    tree = _HelperCallRewriter(helper_names).visit(tree)
    if tree.body and isinstance(tree.body[-1], ast.Expr):
        last = tree.body[-1]
        tree.body[-1] = ast.copy_location(ast.Assign(
            targets=[ast.Name(id=_LAST_VALUE, ctx=ast.Store())], value=last.value), last)
    ast.fix_missing_locations(tree)
    return compile(tree, filename, "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)


# Builtins the model's code does not get: IPython puts these into `builtins` while a
# cell runs, and `get_ipython().user_ns` would hand the model the notebook's variables.
_WITHHELD_BUILTINS = ("get_ipython", "exit", "quit", "display")


def repl_builtins() -> dict[str, Any]:
    table = dict(vars(builtins))
    for name in _WITHHELD_BUILTINS:
        table.pop(name, None)
    return table


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
        self.pending: set[concurrent.futures.Future] = set()


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

    def __init__(self, namespace: dict[str, Any],
                 helpers: dict[str, Callable[..., Awaitable[Any]]],
                 loop: asyncio.AbstractEventLoop | None = None):
        self.namespace = namespace
        self.loop = loop or asyncio.get_running_loop()
        self.helper_names = set(helpers)
        self._lock = threading.Lock()
        self._threads: dict[int, _Step] = {}  # thread ident -> the step it works for
        self._current: _Step | None = None
        self._closed = False
        self.last_output: StepOutput | None = None
        namespace[_ASYNC_TABLE] = {name: self._awaitable(fn) for name, fn in helpers.items()}
        for name, fn in helpers.items():
            namespace[name] = self._blocking(fn)

    # -- serving helpers from the worker threads ---------------------------------------
    def _step_of_caller(self) -> _Step | None:
        """The step the calling thread works for (called with the lock held). A thread
        the model's code started (a ThreadPoolExecutor's) joins the running step on its
        first call; a thread of a stopped step stays with it, and is refused."""
        thread = threading.current_thread()
        step = self._threads.get(thread.ident)
        if step is None or (step.finished and not step.stopped):
            step = self._current
            if step is not None:
                self._threads[thread.ident] = step
                step.threads.add(thread)
        return step

    def _submit(self, coro) -> concurrent.futures.Future:
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

    def _blocking(self, fn):
        def call(*args, **kwargs):
            if _on_loop_thread(self.loop):
                raise RuntimeError(f"{fn.__name__}() would block the event loop here: "
                                   f"use `await {fn.__name__}(...)`")
            try:
                return self._submit(fn(*args, **kwargs)).result()
            except concurrent.futures.CancelledError:
                raise StepInterrupted("stopped") from None
        call.__name__ = call.__qualname__ = fn.__name__
        call.__doc__ = fn.__doc__
        call.__signature__ = inspect.signature(fn)
        return call

    def _awaitable(self, fn):
        async def call(*args, **kwargs):
            return await asyncio.wrap_future(self._submit(fn(*args, **kwargs)))
        call.__name__ = call.__qualname__ = fn.__name__
        return call

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
        try:
            compiled = compile_step(code, self.helper_names, step_filename(step.id))
        except SyntaxError:
            output.error = traceback.format_exc(limit=0)
            return output

        done: asyncio.Future = self.loop.create_future()
        step.thread = threading.Thread(target=self._execute, name=f"rlm-step-{step.id}",
                                       args=(step, compiled, buffer, output, done),
                                       daemon=True)
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
                    output.error = (f"TimeoutError: this step ran longer than "
                                    f"{timeout:g}s and was stopped")
                except BaseException:
                    self._stop(step)
                    output.error = "KeyboardInterrupt: the run was interrupted"
                    raise
        finally:
            self._current = None
            output.stdout = buffer.getvalue()
            output.elapsed_s = time.perf_counter() - started
        return output

    def _execute(self, step: _Step, compiled, buffer, output: StepOutput,
                 done: asyncio.Future) -> None:
        ident = threading.get_ident()
        try:
            with self._lock:
                self._threads[ident] = step
                step.threads.add(threading.current_thread())
            with captured_into(buffer):
                try:
                    result = eval(compiled, self.namespace)  # noqa: S307 - by design
                    if inspect.iscoroutine(result):
                        asyncio.run(result)
                    value = self.namespace.pop(_LAST_VALUE, None)
                    if value is not None:
                        output.value = repr(value)
                except StepInterrupted:
                    output.error = "KeyboardInterrupt: the step was stopped"
                except BaseException:  # noqa: BLE001 - shown to the model, as a REPL would
                    output.error = _format_model_traceback()
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
            _kill_chain(self.loop, self._lock, step, time.monotonic() + self.KILL_FOR_S,
                        self.KILL_INTERVAL_S)

    def close(self) -> None:
        """End the REPL: stop any step still running; no helper call is served again."""
        with self._lock:
            self._closed = True
            steps = {step for step in self._threads.values() if not step.finished}
        for step in steps:
            self._stop(step)


def _kill_chain(loop, lock: threading.Lock, step: _Step, deadline: float,
                interval: float) -> None:
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
                    ctypes.c_ulong(thread.ident), ctypes.py_object(StepInterrupted))
    if alive and time.monotonic() < deadline:
        try:
            loop.call_later(interval, _kill_chain, loop, lock, step, deadline, interval)
        except RuntimeError:
            pass  # the loop is closed


def _resolve(future: asyncio.Future) -> None:
    if not future.done():
        future.set_result(None)


def _on_loop_thread(loop: asyncio.AbstractEventLoop) -> bool:
    try:
        return asyncio.get_running_loop() is loop
    except RuntimeError:
        return False


def _format_model_traceback() -> str:
    """The traceback as a REPL shows it: only the model's own frames."""
    import sys

    etype, value, tb = sys.exc_info()
    frames = [f for f in traceback.extract_tb(tb) if is_step_filename(f.filename)]
    lines = ["Traceback (most recent call last):\n"] if frames else []
    for frame in frames:
        lines.append(f"  line {frame.lineno}, in {frame.name}\n")
        if frame.line:
            lines.append(f"    {frame.line}\n")
    lines.extend(traceback.format_exception_only(etype, value))
    return "".join(lines)
