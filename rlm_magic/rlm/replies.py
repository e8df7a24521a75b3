"""How the root model's replies are read: the code blocks to run, and the final answer."""

from __future__ import annotations

import re
from dataclasses import dataclass

_FENCE = re.compile(r"^```[ \t]*([\w+-]*)[^\n]*\n(.*?)^```[ \t]*$", re.MULTILINE | re.DOTALL)
_CODE_LANGS = {"repl", "python", "py", "python3"}


def code_blocks(text: str) -> list[str]:
    """The ```repl / ```python blocks of a reply, in order."""
    return [m.group(2) for m in _FENCE.finditer(text) if m.group(1).lower() in _CODE_LANGS]


def with_code_as_pointers(text: str) -> str:
    """The reply with each runnable block replaced by "[code block N below]": for views
    that show the code itself, highlighted, right after the text."""
    numbers = iter(range(1, 10_000))

    def pointer(match):
        if match.group(1).lower() not in _CODE_LANGS:
            return match.group(0)
        return f"[code block {next(numbers)} below]"

    return _FENCE.sub(pointer, text).strip()


def strip_code(text: str) -> str:
    """The reply with every fenced block blanked out, so FINAL inside code is ignored."""
    return _FENCE.sub("", text)


@dataclass(frozen=True)
class FinalMarker:
    kind: str  # "FINAL" or "FINAL_VAR"
    value: str


def find_final(text: str) -> FinalMarker | None:
    """FINAL(...) / FINAL_VAR(...) at the start of a line, outside code blocks.

    FINAL's answer may span lines: it ends at the first line that ends with ")", so
    prose after the answer ("Hope this helps (really).") is not swallowed, while
    parentheses inside the answer ("f(x)", "a) first") are kept."""
    prose = strip_code(text)
    for match in re.finditer(r"^[ \t]*(FINAL_VAR|FINAL)\(", prose, re.MULTILINE):
        kind, rest = match.group(1), prose[match.end():]
        if kind == "FINAL_VAR":
            end = rest.find(")")
            if end >= 0:
                return FinalMarker(kind, rest[:end].strip().strip("'\"` "))
            continue
        offset = 0
        for line in rest.splitlines(keepends=True):
            stripped = line.rstrip()
            if stripped.endswith(")"):
                return FinalMarker(kind, _unquote(rest[:offset + len(stripped) - 1].strip()))
            offset += len(line)
    return None


def _unquote(value: str) -> str:
    for quote in ('"""', "'''", '"', "'"):
        if len(value) >= 2 * len(quote) and value.startswith(quote) and value.endswith(quote):
            return value[len(quote):-len(quote)]
    return value
