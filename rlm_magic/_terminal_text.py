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
