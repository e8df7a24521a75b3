"""An answer is final only if the model could know it: what a reply wrote after its
code, before it saw that code's output.

Some models (Claude 4.6 among them) do not stop after a code block: they write what they
expect it to print ("Output: ...") and an answer built on that guess, in the same reply.
Whether an answer was guessed is decided by where it came from (``finishing``: a replay
of the reply with its data changed, ``repl.provenance``); this module handles the text.

What the model wrote once it began guessing a block's output (a line such as
"Output:", or a ```output / ```text fence, right after the block; not a heading that a
block of code follows) is left out: neither run nor read for an answer; the
conversation keeps the reply up to there, with a note, and a streamed turn is stopped
there (``LiveTurn``). A withheld answer is said to the model in one line (``told``).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import TYPE_CHECKING

from ..replies import normalise, read_reply
from ..result import Withheld

if TYPE_CHECKING:
    from ..replies import Fence, Reply
    from ..result import Iteration

UNSEEN = "unseen output"  # an answer written after code whose output was not seen

# A line that labels what a block printed: "Output:", "**Output:**", "Result: 20".
_GUESS_LABEL = re.compile(
    r"[ \t]*(?:[>*_#]+[ \t]*)*(?:(?:expected|actual|execution|console|printed|sample)[ \t]+)?"
    r"(?:output|outputs|result|results|stdout)[ \t]*[*_]*[ \t]*(?::|$)",
    re.IGNORECASE,
)
_GUESS_FENCE = re.compile(
    r"[ \t]*`{3,}[ \t]*(?:output|text|txt|plaintext|console|stdout|result)[ \t]*$", re.IGNORECASE
)
_BLANK_LINES = re.compile(r"[ \t]*\n(?:[ \t]*\n)*")
_CODE_FENCE = re.compile(r"[ \t]*`{3,}[ \t]*(?:repl|python|py|python3|py3)[ \t]*(?:\n|$)", re.I)

LEFT_OUT_NOTE = (
    "[The rest of this reply was left out: it was written before the output of the code "
    "above was seen.]"
)


def guessed_output_at(text: str, fences: Sequence[Fence], streaming: bool = False) -> int | None:
    """Where the reply begins to guess a block's output: the first line after a closed
    runnable block (blank lines between) that labels output or opens an output fence. A
    label followed by a block of code ("Results:", then ```repl) is a heading, not a
    guess; ``streaming``: a label whose next line has not arrived is not one yet."""
    for fence in fences:
        if not (fence.runnable and fence.closed):
            continue
        gap = _BLANK_LINES.match(text, fence.end)
        if gap is None:  # prose on the closing fence's own line
            continue
        start = gap.end()
        end = text.find("\n", start)
        line = text[start : end if end != -1 else len(text)]
        if line and _GUESS_FENCE.match(line):
            return start
        if line and _GUESS_LABEL.match(line):
            following = _BLANK_LINES.match(text, end) if end != -1 else None
            if following is None or following.end() >= len(text):
                if streaming:
                    continue  # the next line decides
                return start
            if not _CODE_FENCE.match(text, following.end()):
                return start
    return None


def as_seen(reply: str, reading: Reply, iteration: Iteration) -> str:
    """The reply as the conversation keeps it, ``reading`` being the part the run read
    (up to any guess of the output): without the guess and all that followed it, and,
    when an answer of the turn was withheld, without the text after its last block
    (it was written before the output was seen). What was left out goes to the
    trajectory; an answer in it is withheld too."""
    text = normalise(reply)
    kept = reading.text
    if len(kept) < len(text):
        guess = text[len(kept) :]
        iteration.withheld.append(Withheld(short(guess.strip().split("\n")[0]), "guessed output"))
        final = read_reply(guess).final
        if final is not None:
            iteration.withheld.append(Withheld(short(f"{final.kind}({final.value})"), UNSEEN))
    if any(item.why != "guessed output" for item in iteration.withheld):
        ends = [fence.end for fence in reading.fences if fence.runnable]
        kept = kept[: max(ends)] if ends else kept
    if kept.rstrip() == text.rstrip():
        return reply
    return f"{kept.rstrip()}\n\n{LEFT_OUT_NOTE}"


def told(iteration: Iteration) -> str | None:
    """The one line that tells the model an answer of its turn was not taken, if one
    was."""
    for item in iteration.withheld:
        if item.why == UNSEEN:
            return (
                f"[Your answer {item.what} was written before you saw the output above, so "
                "it was not taken; if it stands, give it again.]"
            )
        if item.why == "unseen failure":
            return (
                f"[Your answer {item.what} was not taken: a block of that reply failed "
                "(see above) before you saw it; if the answer stands, give it again.]"
            )
    return None


def short(text: str, limit: int = 120) -> str:
    """``text`` on one line, cut to ``limit`` characters."""
    text = " ".join(text[: 4 * limit].split())
    return text if len(text) <= limit else text[: limit - 3] + "..."
