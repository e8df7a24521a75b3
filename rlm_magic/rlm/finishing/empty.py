"""An answer that says nothing: empty, or only a label whose value is empty.

A run's code often builds its answer as a label and a value (``f"Most timeouts by
service: {ranked}"``); when the data held nothing it matched, the value is empty and the
answer is the label alone, or the label and ``[]``, ``{}``, ``None``, ``nan``. Such an
answer is not taken (``answers.Finishing``): the model is told so and may say in words
that nothing was found, which is an answer.

The rule, line by line: a line says nothing when each of its parts (split at ``,`` ``;``
``|`` outside brackets) is, once a label (text up to its last ``:`` or ``=`` outside
brackets) and punctuation are taken off, empty or an empty value as Python, JSON or
pandas write one; a bracketed value says nothing when every item in it says nothing.
An answer says nothing when every line does. A number (``0``), a word, ``False`` say
something.
"""

from __future__ import annotations

import re

# Values that hold nothing, as Python, JSON, JavaScript and pandas print them (lowered).
EMPTY_VALUES = frozenset(
    {"", "none", "null", "nil", "nan", "undefined", "n/a", "''", '""', "empty"}
)
_CALL = re.compile(r"^[A-Za-z_][\w.]*\((.*)\)$", re.DOTALL)  # set(), Counter({}), ...
_PANDAS_EMPTY = re.compile(r"^(empty (dataframe|series)\b.*|(index|columns): \[\])$")
_OPEN, _CLOSE = "([{", ")]}"
_PUNCTUATION = " \t.,;:!?*_`~-–—>#"  # Markdown emphasis and headings too
# Past this, an answer is taken to say something without being read (it is long).
_MOST_CHARS = 10_000


def says_nothing(answer: str) -> bool:
    """Whether ``answer`` is empty, or only labels with empty values (see above)."""
    if len(answer) > _MOST_CHARS:
        return False
    return all(_line_says_nothing(line) for line in answer.splitlines() or [""])


def _line_says_nothing(line: str) -> bool:
    if _PANDAS_EMPTY.match(line.strip().lower()):
        return True
    return all(_value_says_nothing(_without_label(part)) for part in _split(line, ",;|"))


def _value_says_nothing(value: str, depth: int = 0) -> bool:
    value = value.strip(_PUNCTUATION)
    if value.lower() in EMPTY_VALUES:
        return True
    if depth > 20:
        return False
    call = _CALL.match(value)
    if call is not None:
        value = call.group(1).strip()
        if not value:
            return True
    if len(value) >= 2 and value[0] in _OPEN and value[-1] == _CLOSE[_OPEN.index(value[0])]:
        inner = value[1:-1]
        if _balanced(inner):
            return all(
                _value_says_nothing(_without_label(item), depth + 1) for item in _split(inner, ",")
            )
    return False


def _without_label(part: str) -> str:
    """``part`` after its last ``:`` or ``=`` outside brackets (all of it if none)."""
    depth, at = 0, -1
    for index, char in enumerate(part):
        if char in _OPEN:
            depth += 1
        elif char in _CLOSE:
            depth -= 1
        elif char in ":=" and depth == 0:
            at = index
    return part[at + 1 :]


def _split(text: str, separators: str) -> list[str]:
    """``text`` split at ``separators`` outside brackets."""
    parts, depth, start = [], 0, 0
    for index, char in enumerate(text):
        if char in _OPEN:
            depth += 1
        elif char in _CLOSE:
            depth -= 1
        elif char in separators and depth == 0:
            parts.append(text[start:index])
            start = index + 1
    parts.append(text[start:])
    return parts


def _balanced(text: str) -> bool:
    depth = 0
    for char in text:
        if char in _OPEN:
            depth += 1
        elif char in _CLOSE:
            depth -= 1
            if depth < 0:
                return False
    return depth == 0
