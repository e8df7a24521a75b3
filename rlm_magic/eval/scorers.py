"""Scorers: how right an answer is, from 0 to 1, against the expected answer.

A scorer is any function ``(answer: str, expected) -> float``. Answers are read the way
a person would: case, surrounding quotes, a trailing full stop and Markdown emphasis do
not count against them, and a number is found inside a sentence ("There are 42.").
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable
from typing import Any

Scorer = Callable[[str, Any], float]

_EDGES = " \t\n\r\"'`*_.,;:!?()[]{}"


def normalize(text: str) -> str:
    """Lower case, inner whitespace as one space, quotes and punctuation off the ends."""
    return " ".join(str(text).split()).strip(_EDGES).lower()


def exact(answer: str, expected: Any) -> float:
    """1 when the answer is the expected one (normalized), or ends with it as its last
    line or after "answer:"; else 0."""
    want = normalize(str(expected))
    got = normalize(answer)
    if got == want:
        return 1.0
    lines = [normalize(line) for line in str(answer).strip().splitlines() if line.strip()]
    if lines and lines[-1] == want:
        return 1.0
    said = re.search(r"answer\s*(?:is|:)\s*(.+)$", str(answer), re.IGNORECASE | re.DOTALL)
    return 1.0 if said is not None and normalize(said.group(1)) == want else 0.0


_NUMBER = re.compile(r"[-+]?\d[\d,]*(?:\.\d+)?")


def first_number(text: str) -> float | None:
    """The last number in the answer's last line that has one (models put the answer
    last), commas as thousands separators; None when there is none."""
    for line in reversed(str(text).strip().splitlines()):
        found = _NUMBER.findall(line)
        if found:
            try:
                return float(found[-1].replace(",", ""))
            except ValueError:
                return None
    return None


def numeric(rel_tol: float = 0.0, abs_tol: float = 0.0) -> Scorer:
    """A scorer: 1 when the answer's number is within the tolerance of the expected
    one (``math.isclose``), else 0. Both tolerances 0: the same number."""

    def score(answer: str, expected: Any) -> float:
        got = first_number(answer)
        if got is None:
            return 0.0
        return 1.0 if math.isclose(got, float(expected), rel_tol=rel_tol, abs_tol=abs_tol) else 0.0

    score.__name__ = f"numeric(rel_tol={rel_tol:g}, abs_tol={abs_tol:g})"
    return score


def oolong_numeric(answer: str, expected: Any) -> float:
    """OOLONG's score of a numeric answer: 0.75 to the power of how far off it is (1 when
    right, 0.75 one off, 0.56 two off...); 0 with no number."""
    got = first_number(answer)
    return 0.0 if got is None else 0.75 ** abs(got - float(expected))


def comma_list(answer: str) -> set[str]:
    """The answer's items, split on commas, semicolons and new lines, normalized."""
    return {normalize(part) for part in re.split(r"[,;\n]", str(answer)) if normalize(part)}


def dash_pairs(answer: str) -> set[str]:
    """Pairs of numbers written ``a-b`` (or ``(a, b)``, ``a & b``), each as ``"a-b"`` with
    the smaller first."""
    pairs = re.findall(r"(\d+)\s*(?:-|–|&|,|and)\s*(\d+)", str(answer))
    return {"-".join(sorted((a, b), key=int)) for a, b in pairs if a != b}


def set_overlap(parse: Callable[[str], set[str]] = comma_list) -> Scorer:
    """A scorer: the F1 of the answer's items (``parse``) against the expected set; 1 when
    both are empty."""

    def score(answer: str, expected: Any) -> float:
        want = set(_as_strings(expected))
        got = parse(answer)
        if not want and not got:
            return 1.0
        hits = len(want & got)
        if hits == 0:
            return 0.0
        precision, recall = hits / len(got), hits / len(want)
        return 2 * precision * recall / (precision + recall)

    score.__name__ = f"set_overlap({getattr(parse, '__name__', 'parse')})"
    return score


def _as_strings(expected: Any) -> Iterable[str]:
    if isinstance(expected, str):
        return comma_list(expected)
    return (normalize(str(e)) for e in expected)


def name_of(scorer: Scorer) -> str:
    return getattr(scorer, "__name__", type(scorer).__name__)
