"""Where an answer came from, as the kernel decides it from a replay's digests
(``repl.provenance``), and, where the replay could not tell, from what the reply wrote."""

from __future__ import annotations

import ast
from collections.abc import Sequence
from enum import Enum


class Origin(Enum):
    """Where an answer came from."""

    COMPUTED = "computed"  # it moved when the data did
    TYPED = "typed"  # the same in every world: the model wrote it
    UNDECIDED = "undecided"  # a world could not run to an answer, and none moved


def origin_of(real: str, digests: Sequence[str | None]) -> Origin:
    """The origin the replay's digests show against the real answer's ``real``."""
    if any(digest is not None and digest != real for digest in digests):
        return Origin.COMPUTED
    if digests and all(digest == real for digest in digests):
        return Origin.TYPED
    return Origin.UNDECIDED


def written_in(codes: Sequence[str]) -> set[str]:
    """The values the reply's code writes out: its strings, placeholder-free f-strings
    and numbers, stripped. Asked only when a replay could not tell an answer's origin:
    an answer among these was most likely typed. The code comes from the root model's
    reply, so its size is bounded by max_tokens."""
    found: set[str] = set()
    for code in codes:
        try:
            tree = ast.parse(code)
        except (SyntaxError, ValueError, RecursionError, MemoryError):
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, (str, int, float)):
                if not isinstance(node.value, bool):
                    found.add(str(node.value).strip())
            elif isinstance(node, ast.JoinedStr):
                parts = [p.value for p in node.values if isinstance(p, ast.Constant)]
                if len(parts) == len(node.values):
                    found.add("".join(map(str, parts)).strip())
    found.discard("")
    return found
