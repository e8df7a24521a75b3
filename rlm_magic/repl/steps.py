"""Running one block of model code: the part both REPLs share.

The in-process REPL (threads of the kernel) and the sandbox worker (a process of its
own) both compile a block with the helper-call rewrite, run it with its output
captured and the scaffold kept (``finishers``), and report a ``StepOutput``. This
module and those it imports use only the standard library: the sandbox worker loads
them, and must start fast.
"""

from __future__ import annotations

import ast
import asyncio
import builtins
import concurrent.futures
import inspect
import io
import linecache
import sys
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .capture import OutputSink, captured_into
from .finishers import (
    Finish,
    Listing,
    answer_dict_finish,
    final_var,
    finisher_functions,
    put_scaffold,
    ready_answer,
    restore_scaffold,
    show_vars,
)
from .helpers import HELPER_NAMES
from .namespace import ASYNC_TABLE, FINISHERS, PRELOADED, PRINT_FINAL, user_variables

# Names the engine, the REPLs and the worker import from here, wherever they live.
__all__ = [
    "ASYNC_TABLE",
    "FINISHERS",
    "HELPER_NAMES",
    "PRELOADED",
    "Listing",
    "StepInterrupted",
    "StepOutput",
    "Submit",
    "awaitable_helper",
    "blocking_helper",
    "compile_step",
    "execute_step",
    "final_var",
    "format_model_traceback",
    "install_helpers",
    "is_step_filename",
    "preloaded",
    "prepare_step",
    "ready_answer",
    "repl_builtins",
    "show_vars",
    "step_filename",
    "user_variables",
]

_LAST_VALUE = "__rlm_last__"
# asyncio functions whose arguments model code means to run concurrently. Matched as
# `asyncio.X(...)` or a name imported from asyncio, so concurrent.futures.wait & co.
# (thread-pool code, which wants the blocking helpers) are left alone. `create_task` is
# also matched as a method (a loop's or a TaskGroup's).
_SCHEDULERS = {
    "gather",
    "create_task",
    "ensure_future",
    "wait",
    "wait_for",
    "as_completed",
    "shield",
}


class StepInterrupted(BaseException):
    """Raised inside a step to stop it (timeout or user interrupt).

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
    # Characters the sandbox cut off before sending (it sends only what the model
    # can be shown); counted in the output-cut note.
    dropped_chars: int = 0
    # How the block finished the run, if it did: [how, answer], how being "code" (it
    # called FINAL/FINAL_VAR), "print" (it printed a FINAL(...) line, the answer being
    # the printed text, read by the engine) or "answer dict".
    finish: list[str] | None = None
    # Scaffold names the block rebound (llm_query, context, ...), put back after it.
    restored: list[str] = field(default_factory=list)

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
                self.asyncio_names |= {
                    a.asname or a.name for a in inner.names if a.name == "asyncio"
                }
            elif isinstance(inner, ast.ImportFrom) and inner.module == "asyncio":
                self.imported |= {a.asname or a.name for a in inner.names if a.name in _SCHEDULERS}
        for inner in ast.walk(node):
            if isinstance(inner, ast.Call) and self._is_scheduler(inner):
                for arg in _arguments(inner):
                    self.scheduled |= {
                        leaf.id for leaf in ast.walk(arg) if isinstance(leaf, ast.Name)
                    }
        self.generic_visit(node)
        return node

    def _is_scheduler(self, call: ast.Call) -> bool:
        func = call.func
        if isinstance(func, ast.Name):
            return func.id in self.imported
        if isinstance(func, ast.Attribute) and func.attr in _SCHEDULERS:
            base = func.value
            return func.attr == "create_task" or (
                isinstance(base, ast.Name) and base.id in self.asyncio_names
            )
        return False

    def _is_helper_call(self, node) -> bool:
        return (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in self.names
        )

    def _to_async(self, call: ast.Call) -> None:
        call.func = ast.copy_location(
            ast.Subscript(
                value=ast.Name(id=ASYNC_TABLE, ctx=ast.Load()),
                slice=ast.Constant(value=call.func.id),
                ctx=ast.Load(),
            ),
            call.func,
        )

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
        elif (
            isinstance(node.func, ast.Attribute)
            and node.func.attr in ("append", "extend")
            and isinstance(node.func.value, ast.Name)
            and node.func.value.id in self.scheduled
        ):
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


class _FinishRewriter(ast.NodeTransformer):
    """Two ways real models finish from code, made explicit at compile time:
    - ``print("FINAL(...)")`` / ``print(f"FINAL({x})")``: a print whose own text (a
      literal or f-string written in the code) begins with FINAL( or FINAL_VAR( goes
      to a print that also finishes. Printed *data* that holds the word never does.
    - ``FINAL_VAR(total)``, a variable written bare instead of its name in quotes: the
      call is told its argument is a value (``FINAL_VAR("total")`` stays a name)."""

    def visit_Call(self, node: ast.Call):
        self.generic_visit(node)
        func = node.func
        if not isinstance(func, ast.Name):
            return node
        if func.id == "print" and node.args and _starts_with_final(node.args[0]):
            node.func = ast.copy_location(ast.Name(id=PRINT_FINAL, ctx=ast.Load()), func)
        elif (
            func.id == "FINAL_VAR"
            and len(node.args) == 1
            and not node.keywords
            and not isinstance(node.args[0], ast.Constant)
        ):
            node.keywords = [ast.keyword(arg="_value_given", value=ast.Constant(True))]
        return node


def _starts_with_final(node: ast.AST) -> bool:
    if isinstance(node, ast.JoinedStr) and node.values:
        node = node.values[0]
    return (
        isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and node.value.lstrip().startswith(("FINAL(", "FINAL_VAR("))
    )


def compile_step(code: str, helper_names: set[str], filename: str):
    """Parse, rewrite and compile a block; the last expression's value is kept."""
    # Registered so tracebacks can quote the model's lines.
    linecache.cache[filename] = (len(code), None, code.splitlines(True), filename)
    tree = ast.parse(code, filename=filename, mode="exec")
    tree = _HelperCallRewriter(helper_names).visit(tree)
    tree = _FinishRewriter().visit(tree)
    if tree.body and isinstance(tree.body[-1], ast.Expr):
        last = tree.body[-1]
        tree.body[-1] = ast.copy_location(
            ast.Assign(targets=[ast.Name(id=_LAST_VALUE, ctx=ast.Store())], value=last.value), last
        )
    ast.fix_missing_locations(tree)
    return compile(tree, filename, "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)


def prepare_step(code: str, helper_names: set[str], filename: str, output: StepOutput):
    """The compiled block, or None with ``output.error`` set for a syntax error."""
    try:
        return compile_step(code, helper_names, filename)
    except SyntaxError:
        output.error = traceback.format_exc(limit=0)
        return None


def execute_step(
    compiled, namespace: dict[str, Any], output: StepOutput, buffer: io.StringIO, sink: OutputSink
) -> None:
    """Run a compiled block in ``namespace`` on this thread, its output captured into
    ``buffer`` through the REPL's ``sink``: errors, the last value, a stop, how the
    block finished the run and the scaffold it rebound all land in ``output``.

    The scaffold (FINAL, FINAL_VAR, SHOW_VARS afresh; the helpers and the context
    variables as they were when the block began) is put back after the block, however
    it ended, so the next block never runs with a helper the model replaced."""
    finish = Finish(namespace)
    scaffold = put_scaffold(namespace, finish)
    sink.buffer = buffer
    try:
        with captured_into(sink):
            try:
                result = eval(compiled, namespace)  # noqa: S307 - by design
                if inspect.iscoroutine(result):
                    asyncio.run(result)
                value = namespace.pop(_LAST_VALUE, None)
                if value is not None:
                    output.value = repr(value)
            except StepInterrupted:
                # A stop. A KeyboardInterrupt the code raises itself is its own error,
                # shown with its traceback below.
                output.error = "KeyboardInterrupt: the step was stopped"
            except BaseException:  # noqa: BLE001 - shown to the model, as a REPL would
                output.error = format_model_traceback()
    finally:
        output.restored = restore_scaffold(namespace, scaffold)
        output.finish = finish.result
        if output.finish is None:
            output.finish, error = answer_dict_finish(namespace)
            if error:
                output.error = (output.error or "") + error
        if output.error and output.finish and output.finish[0] == "answer dict":
            # Not taken from a block that failed (the engine says so): nor by a later one.
            namespace["answer"]["ready"] = False


# Builtins the model's code does not get: IPython puts these into `builtins` while a
# cell runs, and `get_ipython().user_ns` would hand the model the notebook's variables.
_WITHHELD_BUILTINS = ("get_ipython", "exit", "quit", "display")


def repl_builtins() -> dict[str, Any]:
    table = dict(vars(builtins))
    for name in _WITHHELD_BUILTINS:
        table.pop(name, None)
    return table


def format_model_traceback() -> str:
    """The traceback as a REPL shows it: only the model's own frames."""
    etype, value, tb = sys.exc_info()
    frames = [f for f in traceback.extract_tb(tb) if is_step_filename(f.filename)]
    lines = ["Traceback (most recent call last):\n"] if frames else []
    for frame in frames:
        lines.append(f"  line {frame.lineno}, in {frame.name}\n")
        if frame.line:
            lines.append(f"    {frame.line}\n")
    lines.extend(traceback.format_exception_only(etype, value))
    return "".join(lines)


# -- the helpers as model code sees them ---------------------------------------------
Submit = Callable[[str, tuple, dict], concurrent.futures.Future]


def blocking_helper(
    name: str,
    submit: Submit,
    refuse: Callable[[], bool] = lambda: False,
    template: Callable | None = None,
):
    """``name(...)`` that blocks its thread until ``submit`` has the answer. ``refuse``
    says when blocking would freeze the loop that serves the answer."""

    def call(*args, **kwargs):
        if refuse():
            raise RuntimeError(f"{name}() would block the event loop here: use `await {name}(...)`")
        try:
            return submit(name, args, kwargs).result()
        except concurrent.futures.CancelledError:
            raise StepInterrupted("stopped") from None

    call.__name__ = call.__qualname__ = name
    if template is not None:
        call.__doc__ = template.__doc__
        call.__signature__ = inspect.signature(template)
    return call


def awaitable_helper(name: str, submit: Submit):
    async def call(*args, **kwargs):
        return await asyncio.wrap_future(submit(name, args, kwargs))

    call.__name__ = call.__qualname__ = name
    return call


def install_helpers(
    namespace: dict[str, Any],
    names,
    submit: Submit,
    refuse: Callable[[], bool] = lambda: False,
    templates: dict[str, Callable] | None = None,
) -> None:
    """Put both variants of every helper into a REPL namespace."""
    templates = templates or {}
    namespace[ASYNC_TABLE] = {name: awaitable_helper(name, submit) for name in names}
    for name in names:
        namespace[name] = blocking_helper(name, submit, refuse, templates.get(name))


def preloaded(namespace: dict[str, Any], context: Any) -> dict[str, Any]:
    """What a REPL namespace starts with besides the helpers (see ``PRELOADED``): the
    context, the ``answer`` protocol, FINAL/FINAL_VAR/SHOW_VARS, an empty ``history``,
    and asyncio, re and json pre-imported, since models use them without importing."""
    import json
    import re

    return {
        "asyncio": asyncio,
        "re": re,
        "json": json,
        "context": context,
        "answer": {"content": "", "ready": False},
        "history": [],
        **finisher_functions(namespace, Finish(namespace)),
    }
