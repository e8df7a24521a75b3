"""The rewrites a block of model code gets before it is compiled, in one place: helper
calls that are awaited or scheduled go to the awaitable variants, and two ways real
models finish from code are made explicit.

Standard library only: the sandbox worker imports this.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from typing import TypeGuard, cast

from .namespace import ASYNC_TABLE, PRINT_FINAL

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


class HelperCallRewriter(ast.NodeTransformer):
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

    def visit_Module(self, node: ast.Module) -> ast.Module:
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

    def _is_helper_call(self, node: ast.AST) -> TypeGuard[ast.Call]:
        return (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in self.names
        )

    def _to_async(self, call: ast.Call) -> None:
        name = cast(ast.Name, call.func).id  # a helper call's function is a bare name
        call.func = ast.copy_location(
            ast.Subscript(
                value=ast.Name(id=ASYNC_TABLE, ctx=ast.Load()),
                slice=ast.Constant(value=name),
                ctx=ast.Load(),
            ),
            call.func,
        )

    def _all_to_async(self, tree: ast.AST) -> None:
        for inner in _walk_same_scope(tree):
            if self._is_helper_call(inner):
                self._to_async(inner)

    def visit_Await(self, node: ast.Await) -> ast.Await:
        self.generic_visit(node)
        if self._is_helper_call(node.value):
            self._to_async(node.value)
        return node

    def visit_Call(self, node: ast.Call) -> ast.Call:
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

    def visit_Assign(self, node: ast.Assign) -> ast.Assign:
        self.generic_visit(node)
        if any(isinstance(t, ast.Name) and t.id in self.scheduled for t in node.targets):
            self._all_to_async(node.value)
        return node


def _arguments(call: ast.Call) -> list[ast.AST]:
    return [*call.args, *(keyword.value for keyword in call.keywords)]


def _walk_same_scope(tree: ast.AST) -> Iterator[ast.AST]:
    """ast.walk, without descending into lambdas and plain (synchronous) functions."""
    pending = [tree]
    while pending:
        node = pending.pop()
        yield node
        for child in ast.iter_child_nodes(node):
            if not isinstance(child, (ast.Lambda, ast.FunctionDef)):
                pending.append(child)


class FinishRewriter(ast.NodeTransformer):
    """Three ways real models finish from code, made explicit at compile time:
    - ``print("FINAL(...)")`` / ``print(f"FINAL({x})")``: a print whose own text (a
      literal or f-string written in the code) begins with FINAL( or FINAL_VAR( goes
      to a print that also finishes. Printed *data* that holds the word never does.
    - ``print(FINAL(v))``: the finish alone (FINAL returns None, which it would print).
    - ``FINAL_VAR(total)``, a variable written bare instead of its name in quotes: the
      call is told its argument is a value (``FINAL_VAR("total")`` stays a name)."""

    def visit_Call(self, node: ast.Call) -> ast.Call:
        self.generic_visit(node)
        func = node.func
        if not isinstance(func, ast.Name):
            return node
        if func.id == "print" and len(node.args) == 1 and not node.keywords:
            inner = node.args[0]
            if isinstance(inner, ast.Call) and _is_finisher(inner.func):
                # print(FINAL(v)), as OpenEnv-style models finish: the finish itself,
                # not a print of the None it returns (output the model never saw).
                return inner
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


def _is_finisher(node: ast.AST) -> bool:
    return isinstance(node, ast.Name) and node.id in ("FINAL", "FINAL_VAR")


def _starts_with_final(node: ast.AST) -> bool:
    if isinstance(node, ast.JoinedStr) and node.values:
        node = node.values[0]
    return (
        isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and node.value.lstrip().startswith(("FINAL(", "FINAL_VAR("))
    )
