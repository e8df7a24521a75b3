"""How a run's answer is taken, and when an answer is not one.

A run finishes when the model gives its answer in one of the accepted forms
(``replies.ACCEPTED_FORMS``): a ``FINAL(...)`` or ``FINAL_VAR(...)`` marker in its reply,
a ``FINAL``/``FINAL_VAR`` call in its code, a ``FINAL(...)`` line its code prints, or the
answer dict set ready. ``Finishing`` reads these against the REPL (a variable's value
for ``FINAL_VAR``), and refuses what cannot be an answer: a marker cut off with its
reply, an answer that says nothing (empty, or a label with an empty value: ``empty``),
an answer given by a block that then failed, and an answer the
model typed in a reply whose code read data it had not seen: typed, because a replay of
the reply with its data changed gives it again (``repl.provenance``; ``Origin``), however
it is spelled. ``is_error`` tells an answer that is only a failed call's error string.

Why one module: every form of finish passes the same refusals in the same order (cut
off, unseen failure, says nothing, echoed, typed before seen); one reader keeps them
alike for every form, which is what a model cannot talk its way around.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

from ...repl.finishers import FinishKind
from ...repl.provenance import Replayed, answer_digest
from ..replies import ACCEPTED_FORMS, Final, Reply, read_printed_final, read_reply
from ..result import Iteration, RLMResult, Withheld
from .echoes import Echoes
from .empty import says_nothing
from .origin import Origin, origin_of, written_in
from .seen_output import UNSEEN, guessed_output_at, short

if TYPE_CHECKING:
    from ...repl.base import REPL


# A replay is given this long, and twice what the reply's blocks took, within a step's time.
REPLAY_MIN_S = 5.0


# The stop reason of a run whose answer said nothing twice (see ``Finishing.told_nothing``).
EMPTY_ANSWER = "empty_answer"


class Finishing:
    """What one run knows about how it may finish, and its answer once it has one."""

    def __init__(self, result: RLMResult):
        self.result = result
        self.repl: REPL | None = None  # the run's, once it is open
        # (answer, FinishKind's value) once a block finished the run.
        self.finished: tuple[str, str] | None = None
        self.cut_off = ""  # where the last root turn was cut ("" if it was whole)
        self.broken_off: str | None = None  # why the last root turn broke off
        self._told_restored: set[str] = set()  # scaffold names the model was told of
        self.step_timeout = 120.0  # the run's, bounding a replay (``_guessed``)
        # Digests of the answers withheld in the last turn, and in this one so far.
        self._withheld_last: set[str] = set()
        self._withheld_now: set[str] = set()
        # Whether the model was told that an answer of its said nothing: a second one is
        # taken, and ends the run as an empty answer (``EMPTY_ANSWER``) rather than
        # spend every iteration left on a model that found nothing.
        self.told_nothing = False
        # The run's own instructions: an answer that only repeats them is not one.
        self.echoes = Echoes([ACCEPTED_FORMS])
        # A session's variables from its earlier questions: name -> the question (from 1)
        # it came from. Data of those questions' contexts, never this question's answer.
        self.carried_from: dict[str, int] = {}

    def next_turn(self) -> None:
        """A new root turn: what the last one withheld may now be given again."""
        self._withheld_last, self._withheld_now = self._withheld_now, set()

    def read(self, reply: str, *, until_guess: bool = False) -> Reply:
        """The reply's blocks and markers. A turn that broke off (a stall, a server
        gone) is kept as far as it came, but a block it left unclosed is not run: it may
        be half written. ``until_guess``: only the reply up to where it begins to guess
        its code's output (``seen_output``)."""
        reading = read_reply(reply)
        if until_guess:
            at = guessed_output_at(reading.text, reading.fences)
            if at is not None:
                reading = read_reply(reading.text[:at])
        if self.broken_off:
            reading = replace(reading, fences=[f for f in reading.fences if f.closed])
            self.broken_off = None
        return reading

    def readable(self, reading: Reply) -> tuple[Final | None, list[str]]:
        """The reply's final answer and the problems to tell the model. An answer read
        by the line rule (no ')' balances it) from a reply cut off (at max_tokens, or
        broken off by a stall or the step's deadline) may be cut off itself: it is not
        taken."""
        final = reading.final
        if final is not None and self.cut_off and not final.balanced:
            return None, [
                f"Your reply was cut off {self.cut_off} inside "
                f"{final.kind}(...), so its answer may be cut off too; it was "
                "not taken. Give the "
                f"answer again, shorter. Accepted forms: {ACCEPTED_FORMS}."
            ]
        return final, reading.problems

    async def by_block(
        self,
        finish: Sequence[str] | None,
        outputs: list[str],
        iteration: Iteration,
        number: int = 1,
        code: str = "",
    ) -> bool:
        """Whether block ``number`` of the reply, ``code``, finished the run (the REPL,
        in this process or the sandbox's, says how); the answer goes to ``finished``."""
        if not finish:
            return False
        how, answer = FinishKind(finish[0]), finish[1]
        printed, variable = answer, None
        if how is FinishKind.PRINTED_MARKER:  # the block printed a FINAL(...) line
            marker = read_printed_final(answer)
            if marker is None:
                outputs.append(
                    f"Your code printed {answer.strip()[:200]!r}, from which no "
                    "FINAL(...) answer could be read, so the run goes on. "
                    f"Accepted forms: {ACCEPTED_FORMS}."
                )
                return False
            resolved, problem, by_variable = await self._resolve(marker, iteration)
            if resolved is None:
                outputs.append(problem)
                return False
            answer, variable = resolved, marker.value if by_variable else None
        head = answer[:200]  # an answer may be megabytes: name it by its start
        what = short(
            {
                FinishKind.CALL_IN_CODE: f"FINAL({head!r})",
                FinishKind.ANSWER_DICT: f"answer['content'] = {head!r}",
            }.get(how, printed[:200].strip())
        )
        if any(run.error for run in iteration.code[:-1]):
            iteration.withheld.append(Withheld(what, "unseen failure"))
            return False
        if how is not FinishKind.PRINTED_MARKER and self._refused_as_nothing(answer):
            outputs.append(self.said_nothing(what, answer, iteration))
            return False
        codes = [run.code for run in iteration.code[:number]]
        echoed = (
            None  # a printed marker was checked as it was resolved
            if how is FinishKind.PRINTED_MARKER
            else self.echoes.problem(answer, what, typed=answer.strip() in written_in(codes))
        )
        if echoed is not None:
            outputs.append(echoed)
            return False
        real = answer_digest(*(("variable", answer) if variable else (how.value, printed)))
        if await self._guessed(codes, real, iteration, variable, answer):
            iteration.withheld.append(Withheld(what, UNSEEN))
            return False
        self.finished = (answer, how.value)
        return True

    async def from_text(self, marker: Final, iteration: Iteration) -> tuple[str | None, str]:
        """(the answer a marker in the reply's text gives, or None, and the problem to
        tell the model): one the model typed is not taken from a reply whose code showed
        output it had not seen, nor any from a reply whose code failed (the model wrote
        it before it saw either); a variable's value only if it came from data."""
        answer, problem, by_variable = await self._resolve(marker, iteration)
        if answer is None or not iteration.code:
            return answer, problem
        what = short(f"{marker.kind}({marker.value})")
        if any(run.error for run in iteration.code):
            iteration.withheld.append(Withheld(what, "unseen failure"))
            return None, ""
        codes = [run.code for run in iteration.code]
        # Written in the reply's text, unless it names a variable: then its value's.
        real = answer_digest("variable", answer) if by_variable else None
        variable = marker.value if by_variable else None
        if await self._guessed(codes, real, iteration, variable, answer):
            iteration.withheld.append(Withheld(what, UNSEEN))
            return None, ""
        return answer, problem

    async def _guessed(
        self,
        codes: list[str],
        real: str | None,
        iteration: Iteration,
        variable: str | None,
        answer: str,
    ) -> bool:
        """Whether an answer was written before the model could know it: the reply's
        code read data (a context, a variable from before, a sub-call's answer), so what
        it showed or made was news to the model, and the answer did not come from that
        data: it stays the same when the reply is replayed with the data changed
        (``repl.provenance``). ``real``: the answer's digest (None: written in the
        reply's text). Code that read no data showed nothing the model's own words did
        not decide; an answer withheld last turn and given again now was given after
        the model saw that turn's output."""
        restated = answer_digest("answer", answer)
        if restated in self._withheld_last:
            return False
        replayed = Replayed()
        if self.repl is not None:
            spent = sum(run.elapsed_s for run in iteration.code)
            seconds = min(self.step_timeout, REPLAY_MIN_S + 2 * spent)
            try:
                replayed = await self.repl.replay(codes, variable, timeout=seconds, answer=real)
            except Exception:  # noqa: BLE001 - a sandbox that cannot say decides nothing
                replayed = Replayed()
        origin = Origin.TYPED if real is None else origin_of(real, replayed.digests)
        if origin is Origin.UNDECIDED:
            # The changed data made the code fail (a JSON context, a DataFrame from an
            # earlier turn): what the reply wrote decides, in this case only.
            typed = answer.strip() in written_in(codes)
            origin = Origin.TYPED if typed else Origin.COMPUTED
            iteration.notes.append(
                "the answer's origin could not be told by a replay (the code ran to no "
                "answer with its data changed): "
                + ("a value the reply's code writes, so typed" if typed else "taken")
            )
        guessed = replayed.read_data is not False and origin is not Origin.COMPUTED
        if guessed:
            self._withheld_now.add(restated)
        return guessed

    async def _still_carried(self) -> dict[str, str | None]:
        """The carried variables this question has not set (none outside a session)."""
        if not self.carried_from or self.repl is None:
            return {}
        try:
            held = await self.repl.still_carried()
        except Exception:  # noqa: BLE001 - a sandbox that cannot say: none are known
            return {}
        return {name: digest for name, digest in held.items() if name in self.carried_from}

    async def note_carried(self, answer: str, iteration: Iteration | None = None) -> None:
        """Say so, on the result and in the trajectory, when the answer is the value of a
        variable carried from an earlier question: that question's data, not this
        question's own work."""
        held = await self._still_carried()
        if not held:
            return
        digest = answer_digest("variable", answer)
        name = next((name for name, held_digest in held.items() if held_digest == digest), None)
        if name is None:
            return
        origin = f"the variable {name!r}, carried from question {self.carried_from[name]}"
        self.result.answer_origin = origin
        note = (
            f"the answer is {origin} (data of that question's context), not computed by "
            "this question's code"
        )
        (iteration.notes if iteration is not None else self.result.notes).append(note)

    def settle_empty(self) -> None:
        """A run that ended on an answer saying nothing (given again after the model was
        told) did not answer: its stop reason says so, and the answer stays to be read."""
        result = self.result
        if result.stop_reason == "final" and says_nothing(str(result.final_answer or "")):
            result.stop_reason = EMPTY_ANSWER
            shown = str(result.final_answer or "").strip()[:120]
            result.error = (
                f"the answer says nothing ({shown!r}), given again after the model was "
                "told: the data may hold nothing that matches, or its code misread it"
            )

    def _refused_as_nothing(self, answer: str) -> bool:
        """Whether ``answer`` says nothing and is the first such: refused, and the model
        told so. A second is the model's answer after it was told (it found nothing, or
        cannot read the data): taken, and the run reports it as empty, not answered."""
        return says_nothing(answer) and not self.told_nothing

    def said_nothing(self, what: str, answer: str, iteration: Iteration | None) -> str:
        """Not taken: ``answer``, given by ``what``, says nothing (``empty``). Noted on
        the turn (the last turn's, on the result), and told to the model."""
        self.told_nothing = True
        if not answer.strip():
            return f"{what} gives an empty answer, so the run goes on. Give the answer itself."
        shown = answer.strip()[:120]
        note = (
            f"not taken: {what} says nothing ({shown!r}: a label with an empty value), "
            "so the run went on"
        )
        (iteration.notes if iteration is not None else self.result.notes).append(note)
        return (
            f"{what} says nothing: {shown!r} is a label with an empty value, so it was "
            "not taken and the run goes on. If the data holds nothing that matches, say "
            "so in words; otherwise look at how your code reads the data. Another answer "
            "that says nothing ends the run without an answer."
        )

    def restored_note(self, names: list[str]) -> str:
        """Tell the model, once per name, that the block rebound a name the REPL
        provides, and that it is back."""
        new = [name for name in names if name not in self._told_restored]
        self._told_restored.update(new)
        if not new:
            return ""
        listed = ", ".join(f"`{name}`" for name in new)
        return (
            f"\n[Your code rebound {listed}, which the REPL provides; "
            f"{'it is' if len(new) == 1 else 'they are'} restored for your next "
            "blocks. Keep your own values under other names.]"
        )

    async def resolve(
        self, marker: Final, iteration: Iteration | None = None
    ) -> tuple[str | None, str]:
        """(the answer a marker gives, or None, and the problem to tell the model)."""
        answer, problem, _ = await self._resolve(marker, iteration)
        return answer, problem

    async def _resolve(
        self, marker: Final, iteration: Iteration | None = None
    ) -> tuple[str | None, str, bool]:
        """As ``resolve``, and whether the answer is a REPL variable's value."""
        answer, problem, by_variable = await self._resolve_marker(marker, iteration)
        if answer is not None and self._refused_as_nothing(answer):  # "", "Counts: []"
            given = short(f"{marker.kind}({marker.value})")
            return None, self.said_nothing(given, answer, iteration), by_variable
        if answer is not None:
            given = short(f"{marker.kind}({marker.value})")
            echoed = self.echoes.problem(answer, given, typed=not by_variable)
            if echoed is not None:
                return None, echoed, by_variable
        return answer, problem, by_variable

    async def _resolve_marker(
        self, marker: Final, iteration: Iteration | None = None
    ) -> tuple[str | None, str, bool]:
        repl = self.repl
        if marker.kind == "FINAL":
            # FINAL(name), where name is exactly a REPL variable's: a real model's slip
            # for FINAL_VAR(name). Answer with the value, and say so.
            value = None
            if marker.value in await self._still_carried():
                # A word of prose, not a variable this question's code set: a value an
                # earlier question (its context, perhaps hostile) left under that name
                # must not become this question's answer.
                note = (
                    f"FINAL({marker.value}) names a variable carried from question "
                    f"{self.carried_from[marker.value]}, not one this question's code set: "
                    "read as the word itself"
                )
                (iteration.notes if iteration is not None else self.result.notes).append(note)
                return marker.value, "", False
            if repl is not None and marker.value.isidentifier():
                try:
                    if marker.value in await repl.variable_names():
                        value = await repl.final_var(marker.value)
                except Exception:  # noqa: BLE001 - a sandbox that cannot say: the text stands
                    value = None
                if value is not None:
                    note = (
                        f"FINAL({marker.value}) names a REPL variable: answered with "
                        "its value, as FINAL_VAR would"
                    )
                    if iteration is not None:
                        iteration.notes.append(note)
                    else:
                        self.result.notes.append(note)
                    return value, "", True
            return marker.value, "", False
        value = await repl.final_var(marker.value) if repl else None
        if value is not None:
            return value, "", True
        names = ", ".join(await repl.variable_names() if repl else []) or "none yet"
        return (
            None,
            (
                f"FINAL_VAR({marker.value}): there is no variable named "
                f"{marker.value!r} in the REPL (variables: {names})."
            ),
            False,
        )


def is_error(answer: str | None) -> bool:
    """An answer that is a failed call's error string, or only such strings (a
    FINAL_VAR of a list whose every item is an ``Error:``, as Python writes it). Read
    item by item, never evaluated (``ast.literal_eval`` of a 1 MB list cost the kernel
    450 MB and a second or two on its loop), never as one pattern over the whole list
    (the regex engine's backtracking state grew 64 MB for 1 MB): linear, within about
    25 ms for the longest list read (10,000 items); a longer one is an answer."""
    if not isinstance(answer, str):
        return False
    text = answer.strip()
    if text.startswith("Error:"):
        return True
    if len(text) > _MOST_ERROR_CHARS or text[:1] not in ("[", "("):
        return False
    close = "]" if text[0] == "[" else ")"
    at, items = _SPACES.match(text, 1).end(), 0  # type: ignore[union-attr]
    while items < _MOST_ERROR_ITEMS:
        item = _ERROR_ITEM.match(text, at)
        if item is None:
            break
        items += 1
        at = _SPACES.match(text, item.end()).end()  # type: ignore[union-attr]
        if text.startswith(",", at):
            at = _SPACES.match(text, at + 1).end()  # type: ignore[union-attr]
            continue
        break
    return items > 0 and text[at:] == close


_MOST_ERROR_CHARS = 1_000_000
_MOST_ERROR_ITEMS = 10_000
_SPACES = re.compile(r"\s*")
# A string literal starting "Error:" (after spaces, or their escapes), as repr writes it;
# its body unrolled (runs of plain characters, then an escape) so it keeps no state per
# character.
_LEAD = r"(?:[^\S\n]|\\[ntr])*"
_ERROR_ITEM = re.compile(
    rf"'{_LEAD}Error:[^'\\\n]*(?:\\.[^'\\\n]*)*'"
    rf'|"{_LEAD}Error:[^"\\\n]*(?:\\.[^"\\\n]*)*"',
    re.DOTALL,
)
