"""A status line fitted to a terminal's width by saying less, not by cutting figures off.

A live line is cut to the width (``TextLine``): it is rewritten a moment later. The last
line of a run or a batch stays on screen, and one wider than the terminal wraps (a
``%%rlm`` run's was 101-104 characters, at 80 columns). So it is built of parts, each
with shorter forms, and the shorter forms are taken, in the order the parts give, until
the line fits, by rank: 0, the details (a rate, what the cache saved); 1 (a part's rank
unless it says), the words (``iteration`` becomes ``iter``); 2, a model's provider and
the counts among others (answers from disk); 3, the last words; then a name's end, cut
with ``…``; 4, the figures a line can do without (tokens and time, in ``%rlm usage``).
How the work ended, its counts and dollars stay.
"""

from __future__ import annotations

from dataclasses import dataclass

from .._terminal_text import fit, width

SEPARATOR = " | "
# Names are cut (with ``…``) once the shorter forms of the ranks below this are taken.
NAMES_CUT = 3.5


@dataclass(frozen=True)
class Part:
    """One part of a line: its text, and shorter forms of it, shortest last (an empty
    one drops the part).

    - ``rank``: the order its shorter forms are taken in, lowest first (a form given as
      ``(rank, text)`` has a rank of its own);
    - ``name``: a part that may be cut with ``…`` (after the ranks below ``NAMES_CUT``);
    - ``glued``: joined to the part before it with a space (``(interrupted)``);
    - ``dropped_at``: the rank at which the part goes altogether, if it may.
    """

    text: str
    shorter: tuple[str | tuple[int, str], ...] = ()
    rank: int = 1
    name: bool = False
    glued: bool = False
    dropped_at: int | None = None


def fitted(parts: list[Part], columns: int) -> str:
    """The parts joined, each as long as ``columns`` allows."""
    glued = [part.glued for part in parts]
    chosen = [part.text for part in parts]
    if _width(chosen, glued) <= columns:
        return _joined(chosen, glued)
    ranks: set[float] = {rank for part in parts for rank, _ in _forms(part)}
    for rank in sorted(ranks | {NAMES_CUT}):
        if rank == NAMES_CUT:
            _cut_names(parts, chosen, glued, columns)
            if _width(chosen, glued) <= columns:
                return _joined(chosen, glued)
        for index, part in enumerate(parts):
            for form in [text for at, text in _forms(part) if at == rank]:
                chosen[index] = form
                if _width(chosen, glued) <= columns:
                    return _joined(chosen, glued)
    return fit(_joined(chosen, glued), columns)


def _cut_names(parts: list[Part], chosen: list[str], glued: list[bool], columns: int) -> None:
    for index, part in enumerate(parts):
        if part.name and chosen[index]:
            room = columns - _width(chosen, glued) + width(chosen[index])
            chosen[index] = fit(chosen[index], max(room, 5))


def _forms(part: Part) -> list[tuple[int, str]]:
    """A part's shorter forms, each with its rank."""
    forms = [form if isinstance(form, tuple) else (part.rank, form) for form in part.shorter]
    return forms + ([(part.dropped_at, "")] if part.dropped_at is not None else [])


def joined(parts: list[Part]) -> str:
    """The parts as they are, joined: the line where width does not matter."""
    return _joined([part.text for part in parts], [part.glued for part in parts])


def _joined(texts: list[str], glued: list[bool]) -> str:
    line = ""
    for text, to_the_last in zip(texts, glued):
        if text:
            line += (" " if to_the_last else SEPARATOR) + text if line else text
    return line


def _width(texts: list[str], glued: list[bool]) -> int:
    return width(_joined(texts, glued))


def short_model(model: str) -> tuple[str, ...]:
    """Shorter forms of a model's name: without its provider (``openai/``)."""
    bare = model.rsplit("/", 1)[-1]
    return (bare,) if bare != model else ()
