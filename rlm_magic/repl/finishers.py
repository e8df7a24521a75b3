"""How model code finishes a run, and the scaffold it may not break.

FINAL, FINAL_VAR and a printed FINAL(...) record the answer of the block that called
them (``Finish``); the ``answer`` dict finishes a run once the model sets it ready.
Before every block the finishers are put in afresh and the helpers and context
variables are noted (``put_scaffold``); after it, whatever the block rebound or deleted
is put back (``restore_scaffold``). SHOW_VARS lists the model's variables.

Standard library only: the sandbox worker imports this.
"""

from __future__ import annotations

from enum import Enum
from typing import Any

from .helpers import HELPER_NAMES
from .namespace import ASYNC_TABLE, FINISHERS, PRINT_FINAL, is_context_name, user_variables


class FinishKind(str, Enum):
    """How a run was finished: in the reply's text, or by a block (the last three, which
    a REPL reports as ``[kind, answer]``: the kind crosses the bridge as its text).
    ``RLMResult.finished_by`` holds its value."""

    TEXT_MARKER = "text marker"  # FINAL(...) / FINAL_VAR(...) in the reply's text
    CALL_IN_CODE = "call in code"  # FINAL() / FINAL_VAR() called in a block
    PRINTED_MARKER = "printed marker"  # a block printed a FINAL(...) line
    ANSWER_DICT = "answer dict"  # a block set answer["ready"] = True


BLOCK_FINISHES = frozenset(
    kind.value
    for kind in (FinishKind.CALL_IN_CODE, FinishKind.PRINTED_MARKER, FinishKind.ANSWER_DICT)
)


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


# FINAL's text beyond this many characters is cut (with a note): the sandbox's bridge
# takes 128 MB, and a character may take four bytes.
_FINAL_LIMIT = 16 * 2**20
_NOT_ANSWERS = {*HELPER_NAMES, *FINISHERS, "asyncio", "re", "json"}


class Finish:
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
        self.result = [FinishKind.CALL_IN_CODE.value, _capped(text)]

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

    def print_final(self, *args: Any, **kwargs: Any) -> None:
        """``print`` for a print whose own text begins with FINAL(: prints it, and
        finishes with the printed text (the run reads the answer from it)."""
        print(*args, **kwargs)
        sep = kwargs.get("sep")
        text = (" " if sep is None else str(sep)).join(str(a) for a in args)
        self.result = [FinishKind.PRINTED_MARKER.value, _capped(text)]


def finisher_functions(namespace: dict[str, Any], finish: Finish) -> dict[str, Any]:
    import functools

    def FINAL(answer: Any) -> None:  # noqa: N802 - the name models are taught
        return finish.final(answer)

    def FINAL_VAR(name: Any, _value_given: bool = False) -> None:  # noqa: N802
        return finish.final_var(name, _value_given)

    FINAL.__doc__, FINAL_VAR.__doc__ = Finish.final.__doc__, Finish.final_var.__doc__
    return {
        "FINAL": FINAL,
        "FINAL_VAR": FINAL_VAR,
        "SHOW_VARS": functools.partial(show_vars, namespace),
        PRINT_FINAL: finish.print_final,
    }


_MISSING = object()


def put_scaffold(namespace: dict[str, Any], finish: Finish) -> dict[str, Any]:
    """Put fresh finishers in, and note the helpers and context variables as they are
    now (the host may have changed them between blocks: a session's new context)."""
    namespace.update(finisher_functions(namespace, finish))
    guarded = (*FINISHERS, PRINT_FINAL, *HELPER_NAMES, ASYNC_TABLE, "context")
    return {name: namespace[name] for name in namespace if name in guarded or is_context_name(name)}


def restore_scaffold(namespace: dict[str, Any], scaffold: dict[str, Any]) -> list[str]:
    """Put back what the block rebound or deleted; the names it touched, for the model."""
    rebound = []
    for name, value in scaffold.items():
        if namespace.get(name, _MISSING) is not value:
            namespace[name] = value
            if not name.startswith("_"):
                rebound.append(name)
    return rebound


def answer_dict_finish(namespace: dict[str, Any]) -> tuple[list[str] | None, str | None]:
    """How the ``answer`` dict finishes the run, if the model set it ready; or, if its
    content cannot be the answer, an error for the block (and it is not ready again)."""
    try:
        answer = ready_answer(namespace)
    except Exception as exc:  # noqa: BLE001 - a content whose str() fails is the model's
        return None, f"answer['content'] could not be read as text: {type(exc).__name__}: {exc}"
    if answer is not None and not answer.strip():  # refused as FINAL('') is
        namespace["answer"]["ready"] = False
        return None, (
            "answer['content'] is empty, so it is not the answer; answer['ready'] is False again"
        )
    finish = None if answer is None else [FinishKind.ANSWER_DICT.value, _capped(answer)]
    return finish, None


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
