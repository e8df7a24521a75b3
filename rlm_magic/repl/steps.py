"""Running one block of model code: the part both REPLs share.

The in-process REPL (threads of the kernel) and the sandbox worker (a process of its
own) both compile a block with the helper-call rewrite, run it with its output captured,
and report a ``StepOutput``. This module imports only the standard library,
``capture`` and ``helpers``: the sandbox worker loads it, and must start fast.
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
from .helpers import HELPER_NAMES

ASYNC_TABLE = "__rlm_async__"
_LAST_VALUE = "__rlm_last__"
_PRINT_FINAL = "__rlm_print_final__"  # what `print("FINAL(...)")` in model code calls
# Put into the namespace afresh before every block: the ways to finish and to look.
FINISHERS = ("FINAL", "FINAL_VAR", "SHOW_VARS")
# What every REPL namespace starts with besides the helpers; not "the model's variables".
PRELOADED = (
    "context",
    "answer",
    "asyncio",
    "re",
    "json",
    *FINISHERS,
    "history",
)  # history: the root conversation, filled in when it is compacted
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
            node.func = ast.copy_location(ast.Name(id=_PRINT_FINAL, ctx=ast.Load()), func)
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
    finish = _Finish(namespace)
    scaffold = _scaffold(namespace, finish)
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
        output.restored = _restore(namespace, scaffold)
        output.finish = finish.result or _answer_dict(namespace, output)
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


# -- what the engine reads from a namespace ------------------------------------------
def user_variables(namespace: dict[str, Any]) -> list[str]:
    """Names of the variables the model made."""
    hidden = {*PRELOADED, *HELPER_NAMES}
    return [
        name
        for name in namespace
        if not name.startswith("_") and name not in hidden and not _is_context_name(name)
    ]


def _is_context_name(name: str) -> bool:
    """A session's earlier contexts (context_0, context_1, ...): given, not made."""
    return name.startswith("context_") and name[8:].isdigit()


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
        **_finishers(namespace, _Finish(namespace)),
    }


class Listing(str):
    """Text that shows as itself as a block's last value (not as a quoted repr)."""

    def __repr__(self) -> str:
        return str(self)


def show_vars(namespace: dict[str, Any]) -> Listing:
    """The variables made in this REPL so far, with their types (one per line)."""
    names = user_variables(namespace)
    if not names:
        return Listing("No variables yet.")
    return Listing("\n".join(f"{name}: {type(namespace[name]).__name__}" for name in names))


# -- finishing from code, and the scaffold the model may not break -------------------------
# FINAL's text beyond this many characters is cut (with a note): the sandbox's bridge
# takes 128 MB, and a character may take four bytes.
_FINAL_LIMIT = 16 * 2**20
_NOT_ANSWERS = {*HELPER_NAMES, *FINISHERS, "asyncio", "re", "json"}


class _Finish:
    """What FINAL / FINAL_VAR / a printed FINAL did during one block (the last wins)."""

    def __init__(self, namespace: dict[str, Any]):
        self.namespace = namespace
        self.result: list[str] | None = None

    def final(self, answer: Any) -> None:
        """Finish the run with ``answer`` once this block ends (a string as it is,
        anything else as str())."""
        if answer is None:
            raise ValueError(
                "FINAL(None): the answer is None (did a function return "
                "nothing?); pass the answer itself"
            )
        text = _as_text(answer)
        if not text.strip():
            raise ValueError(f"FINAL({text!r}): the answer is empty; pass the answer itself")
        self.result = ["code", _capped(text)]

    def final_var(self, name: Any, _value_given: bool = False) -> None:
        """Finish the run with the variable called ``name`` once this block ends."""
        if _value_given:  # FINAL_VAR(total), written bare: total's own value, never
            return self.final(name)  # the variable a string value happens to name
        variables = self.namespace
        if isinstance(name, str):
            key = name.strip().strip("'\"` ")
            if key in variables and key not in _NOT_ANSWERS and not key.startswith("_"):
                return self.final(variables[key])
            made = ", ".join(user_variables(variables)) or "none yet"
            raise NameError(
                f"FINAL_VAR({name!r}): there is no variable named {key!r} "
                f"(variables: {made}); pass a variable's name, or the "
                "answer itself with FINAL(answer)"
            )
        return self.final(name)

    def print_final(self, *args, **kwargs) -> None:
        """``print`` for a print whose own text begins with FINAL(: prints it, and
        finishes with the printed text (the engine reads the answer from it)."""
        print(*args, **kwargs)
        sep = kwargs.get("sep")
        text = (" " if sep is None else str(sep)).join(str(a) for a in args)
        self.result = ["print", _capped(text)]


def _finishers(namespace: dict[str, Any], finish: _Finish) -> dict[str, Any]:
    import functools

    def FINAL(answer):  # noqa: N802 - the name models are taught
        return finish.final(answer)

    def FINAL_VAR(name, _value_given=False):  # noqa: N802
        return finish.final_var(name, _value_given)

    FINAL.__doc__, FINAL_VAR.__doc__ = _Finish.final.__doc__, _Finish.final_var.__doc__
    return {
        "FINAL": FINAL,
        "FINAL_VAR": FINAL_VAR,
        "SHOW_VARS": functools.partial(show_vars, namespace),
        _PRINT_FINAL: finish.print_final,
    }


_MISSING = object()


def _scaffold(namespace: dict[str, Any], finish: _Finish) -> dict[str, Any]:
    """Put fresh finishers in, and note the helpers and context variables as they are
    now (the host may have changed them between blocks: a session's new context)."""
    namespace.update(_finishers(namespace, finish))
    guarded = (*FINISHERS, _PRINT_FINAL, *HELPER_NAMES, ASYNC_TABLE, "context")
    return {
        name: namespace[name] for name in namespace if name in guarded or _is_context_name(name)
    }


def _restore(namespace: dict[str, Any], scaffold: dict[str, Any]) -> list[str]:
    """Put back what the block rebound or deleted; the names it touched, for the model."""
    rebound = []
    for name, value in scaffold.items():
        if namespace.get(name, _MISSING) is not value:
            namespace[name] = value
            if not name.startswith("_"):
                rebound.append(name)
    return rebound


def _answer_dict(namespace: dict[str, Any], output: StepOutput) -> list[str] | None:
    try:
        answer = ready_answer(namespace)
    except Exception as exc:  # noqa: BLE001 - a content whose str() fails is the model's
        output.error = (output.error or "") + (
            f"answer['content'] could not be read as text: {type(exc).__name__}: {exc}"
        )
        return None
    if answer is not None and not answer.strip():  # refused as FINAL('') is
        namespace["answer"]["ready"] = False
        output.error = (output.error or "") + (
            "answer['content'] is empty, so it is not the answer; answer['ready'] is False again"
        )
        return None
    return None if answer is None else ["answer dict", _capped(answer)]


def _as_text(value: Any) -> str:
    return value if isinstance(value, str) else str(value)


def _capped(text: str) -> str:
    if len(text) <= _FINAL_LIMIT:
        return text
    return text[:_FINAL_LIMIT] + (
        f"\n... [the answer holds {len(text):,} characters, more "
        f"than a REPL returns ({_FINAL_LIMIT:,}); the rest is cut]"
    )


def ready_answer(namespace: dict[str, Any]) -> str | None:
    """The ``answer`` dict's content once the model set ``answer["ready"] = True``."""
    answer = namespace.get("answer")
    if isinstance(answer, dict) and answer.get("ready"):
        content = answer.get("content")
        return content if isinstance(content, str) else str(content)
    return None


def final_var(namespace: dict[str, Any], name: str) -> str | None:
    """What ``FINAL_VAR(name)`` answers, or None when there is no such variable."""
    if name not in namespace:
        return None
    value = namespace[name]
    return value if isinstance(value, str) else str(value)
