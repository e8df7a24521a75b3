"""What a REPL namespace holds besides the model's variables: the names of the
scaffold every namespace starts with (the helpers, the finishers, the context...), and
so which names are the model's own.

Standard library only: the sandbox worker imports this.
"""

from __future__ import annotations

from typing import Any

from .helpers import HELPER_NAMES

# The awaitable helpers, by name: what the helper-call rewrite turns awaited calls into.
ASYNC_TABLE = "__rlm_async__"
PRINT_FINAL = "__rlm_print_final__"  # what `print("FINAL(...)")` in model code calls
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


def user_variables(namespace: dict[str, Any]) -> list[str]:
    """Names of the variables the model made."""
    hidden = {*PRELOADED, *HELPER_NAMES}
    return [
        name
        for name in namespace
        if not name.startswith("_") and name not in hidden and not is_context_name(name)
    ]


def is_context_name(name: str) -> bool:
    """A session's earlier contexts (context_0, context_1, ...): given, not made."""
    return name.startswith("context_") and name[8:].isdigit()
