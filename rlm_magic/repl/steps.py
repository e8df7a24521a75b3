"""Running one block of model code: the part both REPLs share.

The in-process REPL (threads of the kernel) and the sandbox worker (a process of its
own) both compile a block with its rewrites (``rewrite``), run it with its output
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
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from types import CodeType
from typing import Any

from .capture import OutputSink, captured_into
from .finishers import (
    Finish,
    FinishKind,
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
from .namespace import ASYNC_TABLE, FINISHERS, PRELOADED, user_variables
from .rewrite import FinishRewriter, HelperCallRewriter

# Names the run, the REPLs and the worker import from here, wherever they live.
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
    # How the block finished the run, if it did: [kind, answer], a ``FinishKind``'s value
    # (for a printed FINAL(...) line, the answer is the printed text, read by the run).
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


def compile_step(code: str, helper_names: set[str], filename: str) -> CodeType:
    """Parse, rewrite and compile a block; the last expression's value is kept."""
    # Registered so tracebacks can quote the model's lines.
    linecache.cache[filename] = (len(code), None, code.splitlines(True), filename)
    tree = ast.parse(code, filename=filename, mode="exec")
    tree = HelperCallRewriter(helper_names).visit(tree)
    tree = FinishRewriter().visit(tree)
    if tree.body and isinstance(tree.body[-1], ast.Expr):
        last = tree.body[-1]
        tree.body[-1] = ast.copy_location(
            ast.Assign(targets=[ast.Name(id=_LAST_VALUE, ctx=ast.Store())], value=last.value), last
        )
    ast.fix_missing_locations(tree)
    compiled: CodeType = compile(tree, filename, "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
    return compiled


def prepare_step(
    code: str, helper_names: set[str], filename: str, output: StepOutput
) -> CodeType | None:
    """The compiled block, or None with ``output.error`` set for a syntax error."""
    try:
        return compile_step(code, helper_names, filename)
    except SyntaxError:
        output.error = traceback.format_exc(limit=0)
        return None


def execute_step(
    compiled: CodeType,
    namespace: dict[str, Any],
    output: StepOutput,
    buffer: io.StringIO,
    sink: OutputSink,
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
        if output.error and output.finish and output.finish[0] == FinishKind.ANSWER_DICT:
            # Not taken from a block that failed (the run says so): nor by a later one.
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
Submit = Callable[[str, tuple[Any, ...], dict[str, Any]], concurrent.futures.Future[Any]]
# What a helper looks like to model code: any arguments, an answer.
Helper = Callable[..., Any]


def blocking_helper(
    name: str,
    submit: Submit,
    refuse: Callable[[], bool] = lambda: False,
    template: Callable[..., Any] | None = None,
) -> Helper:
    """``name(...)`` that blocks its thread until ``submit`` has the answer. ``refuse``
    says when blocking would freeze the loop that serves the answer."""

    def call(*args: Any, **kwargs: Any) -> Any:
        if refuse():
            raise RuntimeError(f"{name}() would block the event loop here: use `await {name}(...)`")
        try:
            return submit(name, args, kwargs).result()
        except concurrent.futures.CancelledError:
            raise StepInterrupted("stopped") from None

    call.__name__ = call.__qualname__ = name
    if template is not None:
        call.__doc__ = template.__doc__
        call.__signature__ = inspect.signature(template)  # type: ignore[attr-defined]
    return call


def awaitable_helper(name: str, submit: Submit) -> Helper:
    async def call(*args: Any, **kwargs: Any) -> Any:
        return await asyncio.wrap_future(submit(name, args, kwargs))

    call.__name__ = call.__qualname__ = name
    return call


def install_helpers(
    namespace: dict[str, Any],
    names: Collection[str],
    submit: Submit,
    refuse: Callable[[], bool] = lambda: False,
    templates: dict[str, Callable[..., Any]] | None = None,
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
