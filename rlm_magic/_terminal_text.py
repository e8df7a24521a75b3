"""Model text made safe to show: the control characters a terminal would act on, shown
instead of acted on.

A model's answer, the turn it is streaming, its code's printed output and the errors that
quote them reach terminals (terminal IPython, ``jupyter console``, a script's stderr). Raw,
an ESC there starts an escape sequence: OSC 52 writes the clipboard, OSC 8 disguises a
link, CSI 2J clears the screen, cursor moves and a lone ``\\r`` or backspace rewrite what
was printed before; a bidi override reorders what follows it on the line. Every view of
such text goes through ``visible`` (or ``one_line``); the values themselves
(``result.answer``, a block's output) stay exactly as the model wrote them.

How they are shown: C0 controls and DEL as their Unicode Control Pictures (ESC as ``␛``,
a carriage return as ``␍``, BEL as ``␇``): one column each, so a line keeps its width and a
table its alignment, and not text a model writes by accident, as a literal ``\\x1b`` could
be. C1 controls and the bidi overrides and isolates have no picture: they are shown as
Python writes them in a repr (``\\x9b``, ``\\u202e``). A line break (``\\n``) and a tab stay;
``\\r\\n`` is a line break too.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

_SHOWN: dict[str, str] = {
    **{chr(c): chr(0x2400 + c) for c in range(0x20) if chr(c) not in "\t\n"},
    "\x7f": "\u2421",  # ␡
    **{chr(c): f"\\x{c:02x}" for c in range(0x80, 0xA0)},
    # Embeddings and overrides (LRE, RLE, PDF, LRO, RLO) and isolates (LRI, RLI, FSI, PDI).
    **{chr(c): f"\\u{c:04x}" for c in [*range(0x202A, 0x202F), *range(0x2066, 0x206A)]},
}
_CONTROL = re.compile("[" + re.escape("".join(_SHOWN)) + "]")
_TABLE = str.maketrans(_SHOWN)


def visible(text: str) -> str:
    """``text`` with every control character but ``\\n`` and ``\\t`` made visible (see
    above); text without any comes back as it is."""
    if _CONTROL.search(text) is None:
        return text
    return text.replace("\r\n", "\n").translate(_TABLE)


def one_line(text: str) -> str:
    """``visible(text)`` on one line, for a line rewritten in place: line breaks and tabs
    become spaces (a tab's width is the terminal's, not one character)."""
    return visible(text).replace("\n", " ").replace("\t", " ")


def width(text: str) -> int:
    """The columns ``text`` takes on a terminal: two for a wide (East Asian) character,
    none for a combining mark, one for any other."""
    if text.isascii():
        return len(text)
    return sum(_char_width(c) for c in text)


def fit(text: str, columns: int) -> str:
    """``text`` cut to at most ``columns`` columns, ending in ``…`` where it was cut."""
    if width(text) <= columns:
        return text
    kept, used = [], 0
    for char in text:
        used += _char_width(char)
        if used > columns - 1:
            break
        kept.append(char)
    return "".join(kept) + "…"


def _char_width(char: str) -> int:
    import unicodedata

    if unicodedata.combining(char):
        return 0
    return 2 if unicodedata.east_asian_width(char) in "WF" else 1


def terminal_columns(default: int = 80) -> int:
    """The columns of the terminal this process writes to (``COLUMNS`` if set), else
    ``default``."""
    import shutil

    return shutil.get_terminal_size((default, 24)).columns


def fitted_table(head: Sequence[str], rows: Sequence[Sequence[str]], columns: int) -> str:
    """A table of figures (the first column names, the others numbers) within
    ``columns`` columns: aligned as a table where it fits; else with the columns that
    are 0 in every row left out (named on a last line); else one entry per row, its
    figures as ``label value`` pairs packed onto lines under its name."""
    table = _aligned(head, rows)
    if max(map(width, table.splitlines())) <= columns:
        return table
    zero = [i for i in range(1, len(head)) if rows and all(row[i] == "0" for row in rows)]
    kept = [i for i in range(len(head)) if i not in zero]
    footer = ("none: " + ", ".join(head[i] for i in zero)) if zero else ""
    narrower = _aligned([head[i] for i in kept], [[row[i] for i in kept] for row in rows])
    if max(map(width, narrower.splitlines())) <= columns:
        return narrower + (f"\n{fit(footer, columns)}" if footer else "")
    lines = []
    for row in rows:
        lines.append(fit(row[0], columns))
        line = " "
        for i in kept[1:]:
            pair = fit(f"{head[i]} {row[i]}", columns - 2)
            if width(line) + 2 + width(pair) > columns and line.strip():
                lines.append(line.rstrip(" ·"))
                line = " "
            line += f" {pair} ·"
        lines.append(line.rstrip(" ·"))
    if footer:
        lines.append(fit(footer, columns))
    return "\n".join(lines)


def _aligned(head: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """Columns two spaces apart, the first to the left, the others to the right, a
    dashed rule under the head."""
    every = [head, *rows]
    widths = [max(width(row[i]) for row in every) for i in range(len(head))]

    def line(row: Sequence[str]) -> str:
        cells = [
            cell + " " * (w - width(cell)) if i == 0 else " " * (w - width(cell)) + cell
            for i, (cell, w) in enumerate(zip(row, widths))
        ]
        return "  ".join(cells).rstrip()

    lines = [line(row) for row in every]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)
