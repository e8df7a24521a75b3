"""The helpers model code calls, in one table: their names, which take a batch of
prompts, and which are another's alias (the official RLM library's spellings).

The REPLs, the sandbox worker, the run and the notebook all read their names here.
Standard library only: the sandbox worker imports this.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Helper:
    """One name model code may call."""

    name: str
    batch: bool  # takes a list of prompts (and may be split, or cut to the budget)
    alias_of: str | None = None  # the helper this name serves, if it is a second name


HELPERS = (
    Helper("llm_query", batch=False),
    Helper("llm_query_batch", batch=True),
    Helper("llm_query_batched", batch=True, alias_of="llm_query_batch"),
    Helper("rlm_query", batch=False),
    Helper("rlm_query_batch", batch=True),
    Helper("rlm_query_batched", batch=True, alias_of="rlm_query_batch"),
)
HELPER_NAMES = tuple(helper.name for helper in HELPERS)
BATCH_NAMES = tuple(helper.name for helper in HELPERS if helper.batch)
# alias -> the helper it serves
ALIASES = {helper.name: helper.alias_of for helper in HELPERS if helper.alias_of is not None}


def bound_to(owner: Any) -> dict[str, Any]:
    """Every helper name, bound to ``owner``'s method of that name (an alias to the
    method it serves): the table a REPL, or a notebook, is given."""
    return {helper.name: getattr(owner, helper.alias_of or helper.name) for helper in HELPERS}
