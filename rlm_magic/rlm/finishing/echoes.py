"""An answer that only repeats the run's own instructions is not an answer.

A weak model that echoes its prompt writes ``FINAL(answer)``, the instructions' own
placeholder, or finishes with the REPL's unset ``answer`` dict, or with a sentence of
the instructions. None of these came from the question or the data. ``Echoes`` holds
the instructions' words (the run's system prompt template, the continue and last-turn
prompts, the accepted forms) and says, in one line for the model, why such an answer
is not taken; everything else passes.

Linear in the answer's size: one normalisation, one substring search per instruction
text, and an answer longer than every instruction text is not searched at all.
"""

from __future__ import annotations

import re
import string
from collections.abc import Iterable

# The placeholders the instructions write inside FINAL(...)/FINAL_VAR(...): bare words,
# or a quoted name given to FINAL_VAR ("variable_name"); never a quoted example answer.
_PLACEHOLDER = re.compile(
    r"""FINAL\(\s*([A-Za-z_][\w ]{0,40}?)\s*\)"""
    r"""|FINAL_VAR\(\s*["']?([A-Za-z_][\w ]{0,40}?)["']?\s*\)"""
)
# The REPL's answer dict as str() writes it.
_ANSWER_DICT = re.compile(
    r"\{'content': (?:'(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\"), 'ready': (?:True|False)\}"
)
# Copied text shorter than this may be a real answer that happens to occur in them.
_COPIED_MIN_CHARS = 24


def _normal(text: str) -> str:
    return " ".join(text.split()).casefold()


def _literal_text(template: str) -> list[str]:
    """The words of a format template, without its fields (the context's preview, the
    question: those are data, and an answer may quote them)."""
    try:
        return [literal for literal, *_ in string.Formatter().parse(template) if literal]
    except ValueError:  # not a format template (a user's own prompt): all of it
        return [template]


class Echoes:
    """The run's instructions, as answers are checked against them."""

    def __init__(self, instructions: Iterable[str], question: str = ""):
        texts = [part for text in instructions for part in _literal_text(text)]
        self.placeholders = {
            _normal(word)
            for text in texts
            for match in _PLACEHOLDER.finditer(text)
            if (word := match.group(1) or match.group(2))
        }
        # A placeholder the question itself uses ("which column holds the value?") may
        # be its answer.
        asked = set(re.findall(r"\w+", _normal(question)))
        self.placeholders -= {word for word in self.placeholders if set(word.split()) <= asked}
        self.texts = [_normal(text) for text in texts]
        self.longest = max((len(text) for text in self.texts), default=0)

    def problem(self, answer: str, given: str, typed: bool = True) -> str | None:
        """Why ``answer`` (as the model ``given`` it, e.g. "FINAL(answer)") is not an
        answer, or None when it may be one. ``typed``: the model wrote the answer itself;
        a value its code took from data ("value", a column's name) may be any word."""
        stripped = answer.strip()
        if _ANSWER_DICT.fullmatch(stripped):
            return (
                f"{given} gives the REPL's `answer` dict, not an answer; pass the answer "
                "itself (or set answer['content'] and answer['ready'] = True)."
            )
        if not typed or len(stripped) > 4 * self.longest + 64:
            return None  # longer than any instruction: not copied from one
        normal = _normal(stripped.strip("`'\"*_.:"))
        if normal in self.placeholders:
            return (
                f"{given} gives {normal!r}, the placeholder of the instructions, not an "
                "answer; give the answer itself."
            )
        if len(normal) >= _COPIED_MIN_CHARS and any(normal in text for text in self.texts):
            return (
                f"{given} repeats the instructions, not an answer to the question; give "
                "the answer itself."
            )
        return None
