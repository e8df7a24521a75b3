"""What a model sends is read in time linear in its size, continued (issue 38): the
code-fence reader, a streamed turn watched for its blocks, and a reply full of markers.
Each reader is timed on this thread's CPU clock against a bound far above what it takes,
so that one gone quadratic fails at once; the fast readers read as the ones they replaced."""

from __future__ import annotations

import re
import time

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from rlm_magic.rlm import replies
from rlm_magic.rlm.finishing.seen_output import guessed_output_at
from rlm_magic.rlm.live_turn import LiveTurn

LARGE = settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
SMALL = settings(max_examples=500, deadline=None)


def cpu_seconds(read, *args):
    """What ``read(*args)`` returns, and the CPU time it took this thread."""
    started = time.thread_time()
    outcome = read(*args)
    return outcome, time.thread_time() - started


# -- the opening fence of a code block --------------------------------------------------
# The pattern it replaced, kept as the specification of what opens a fence.
PLAIN_OPENING = re.compile(r"^([ \t]*)(`{3,})[ \t]*([^\s`]*)[^`\n]*$")

fence_lines = st.text(alphabet=" \t`~ab1\u00a0\r\x0b-_.{}", max_size=40)


@SMALL
@given(line=fence_lines)
@example("```repl")
@example("  ````python title`")
@example("``` \t py x")
@example("```\u00a0lang")
def test_a_fence_opens_on_the_lines_it_opened_on_before(line):
    plain, fast = PLAIN_OPENING.match(line), replies._OPENING.match(line)
    assert (plain is None) == (fast is None)
    if plain is not None and fast is not None:
        assert plain.group(1, 2, 3) == fast.group(1, 2, 3)


@LARGE
@given(
    word=st.text(alphabet="ab1-_.", min_size=1, max_size=5),
    size=st.integers(min_value=1_000, max_value=100_000),
    end=st.sampled_from(["`", " `", "x`", "", " "]),
)
def test_a_long_fence_line_is_read_in_linear_time(word, size, end):
    line = "```" + word * (size // len(word)) + end
    _, seconds = cpu_seconds(replies._OPENING.match, line)
    assert seconds < 0.05 + 1e-6 * size, (word, size, end)  # was 3 s at 20,000


# -- a typed answer's strings, redacted ---------------------------------------------------
SECRET = "sk-proj-Typed0123456789abcdefGHIJKLmnopQRSTuvwx"


async def test_a_typed_answer_of_thousands_of_objects_is_redacted_in_one_pass():
    from rlm_magic.llm.redaction import Redactor
    from rlm_magic.rlm.subcalls import redacted

    answer = {
        "items": [{"name": f"item {i}", "note": "a plain note", "n": i} for i in range(20_000)]
    }
    started = time.process_time()  # (its work is done in a thread)
    clean = await redacted(answer, Redactor(extra=[SECRET]))
    seconds = time.process_time() - started
    assert seconds < 0.25  # string by string: 0.8 s here; now 0.04 s
    assert clean is answer  # (nothing found: not copied)


async def test_a_typed_answer_loses_the_secret_in_its_keys_values_and_cut_texts():
    from rlm_magic.llm.completion import CutAnswer
    from rlm_magic.llm.redaction import Redactor
    from rlm_magic.rlm.subcalls import redacted

    answer = {
        "items": [{"name": "one", "n": 1}, None, True, 2.5],
        f"echo {SECRET}": [SECRET[:20], SECRET[20:]],
        "cut": CutAnswer(f"said {SECRET}", "it stopped at max_tokens", broken_off=False),
    }
    clean = await redacted(answer, Redactor(extra=[SECRET]))
    assert clean["items"] == answer["items"]
    assert clean["echo [REDACTED]"] == ["[REDACTED]", "[REDACTED]"]  # (split in two, too)
    assert isinstance(clean["cut"], CutAnswer) and clean["cut"].text == "said [REDACTED]"
    assert clean["cut"].reason == "it stopped at max_tokens"


# -- a streamed turn, watched for its blocks ---------------------------------------------
class RereadingTurn(LiveTurn):
    """The turn as it was: every line holding a backtick read the whole text again."""

    _scanned = 0

    def _scan(self) -> None:
        text = self.text
        whole = text[: text.rfind("\n") + 1]
        self._fence_pending = "`" in text[len(whole) :]
        if len(whole) <= self._scanned:
            return
        self._scanned = len(whole)
        fences = replies.read_reply(whole, streaming=True).fences
        guess = guessed_output_at(whole, fences, streaming=True)
        if guess is not None:
            fences = [fence for fence in fences if fence.end <= guess]
            self.guessed = True
            if self.on_guess is not None:
                self.on_guess()
        self._block_closed = (
            bool(fences) and fences[-1].runnable and not whole[fences[-1].end :].strip()
        )
        found = [fence.body for fence in fences if fence.runnable]
        if self._run_block is None:
            return
        if len(found) > len(self._codes) and found[: self.ran] == self._codes[: self.ran]:
            self._codes = found


async def never_run(number: int, code: str) -> bool:
    raise AssertionError("not started in these tests")


def watched(turn_class: type[LiveTurn]) -> LiveTurn:
    turn = turn_class(never_run)
    turn._start = lambda run_block: None  # (what is queued is compared, not run)
    turn.on_guess = lambda: None
    return turn


REPLY_LINES = [
    "```repl", "```python", "```", "````", "  ```py", "```text", "``` ```repl", "```repl x",
    "Output:", "**Result:**", "results", "x = 1", "print(x)", "a `b` c", "a ``` b", "",
    "   ", "FINAL(x)", "\x0b", "\u2028```", "more prose",
]  # fmt: skip


@settings(max_examples=400, deadline=None)
@given(
    lines=st.lists(st.sampled_from(REPLY_LINES), max_size=30),
    cuts=st.lists(st.integers(min_value=1, max_value=9), max_size=60),
    line_end=st.sampled_from(["\n", "\n", "\n", "\r\n"]),
)
def test_a_streamed_turn_finds_the_blocks_and_the_guess_it_found_before(lines, cuts, line_end):
    text = line_end.join(lines) + line_end
    old, new = watched(RereadingTurn), watched(LiveTurn)
    at = 0
    for size in [*cuts, len(text)]:
        piece, at = text[at : at + size], at + size
        if not piece:
            break
        for turn in (old, new):
            turn(piece)
        assert (new._codes, new.guessed, new._block_closed) == (
            old._codes,
            old.guessed,
            old._block_closed,
        ), (text, at)


def streamed_cpu_seconds(turn: LiveTurn, lines: list[str]) -> float:
    started = time.thread_time()
    for line in lines:
        turn(line + "\n")
    return time.thread_time() - started


def test_lines_with_backticks_inside_an_open_fence_are_not_read_again_and_again():
    lines = ["```repl", *(f"x = '`{i}`'  # a backtick mid-line" for i in range(8_000))]
    seconds = streamed_cpu_seconds(watched(LiveTurn), lines)
    assert seconds < 1.0  # was 31.7 s (each line read the whole reply); now 0.02 s


def test_many_fences_are_each_read_once():
    lines = [line for i in range(2_000) for line in ("```repl", f"x = {i}", "```", "prose")]
    turn = watched(LiveTurn)
    seconds = streamed_cpu_seconds(turn, lines)
    assert len(turn._codes) == 2_000
    assert seconds < 1.0  # read from the start each time: 13 s for half as many; now 0.12 s


# -- a reply full of markers --------------------------------------------------------------
def test_a_megabyte_of_unreadable_markers_is_read_in_a_fraction_of_a_second():
    reply = "FINAL(a\n" * (2**20 // 8)
    reading, seconds = cpu_seconds(replies.read_reply, reply)
    assert seconds < 0.5  # every marker read: 1.4 s; now 0.02 s
    assert reading.final is None
    *shown, more, capped = reading.problems
    assert len(shown) == replies.MAX_PROBLEMS_SHOWN
    assert more == "(995 more like these.)"
    assert capped.startswith("Your reply holds more than 1,000 FINAL markers;")


def test_an_answer_after_the_markers_read_is_not_taken_and_the_model_is_told():
    within = "FINAL(\n" * 999 + "FINAL(42)\n"
    past = "FINAL(\n" * 1_000 + "FINAL(42)\n"
    assert replies.read_reply(within).final == replies.Final("FINAL", "42")
    reading = replies.read_reply(past)
    assert reading.final is None
    assert "those past them were not read" in reading.problems[-1]


def test_a_few_problems_are_all_said():
    reading = replies.read_reply("FINAL(\nFINAL_VAR(not a name)\n")
    assert len(reading.problems) == 2
    assert not any("more like these" in problem for problem in reading.problems)


def test_a_mention_of_final_mid_sentence_is_found_past_a_megabyte_of_lines():
    reply = "x\n" * 2**19 + "then FINAL is here\r\nmore"
    reading = replies.read_reply(reply)
    assert reading.problems == [
        "FINAL was not read as your answer in 'then FINAL is here': it must begin a line "
        f"and hold the answer in parentheses. Accepted forms: {replies.ACCEPTED_FORMS}."
    ]


# -- fences found by searching, not line by line ------------------------------------------
def plain_fences(text: str) -> list[replies.Fence]:
    """The fence reader as it was: every line looked at in turn."""
    fences: list[replies.Fence] = []
    lines = text.splitlines(keepends=True)
    offset, i = 0, 0
    while i < len(lines):
        line = lines[i]
        opening = replies._OPENING.match(line.rstrip("\n"))
        if opening is None:
            offset += len(line)
            i += 1
            continue
        indent, ticks, language = len(opening.group(1)), opening.group(2), opening.group(3)
        start = offset
        body_lines: list[str] = []
        offset += len(line)
        i += 1
        closed = False
        while i < len(lines):
            line = lines[i]
            stripped = line.lstrip(" \t")
            if stripped.startswith(ticks):
                rest = stripped[len(ticks) :].strip()
                if not body_lines and not language and re.fullmatch(r"[\w+-]+", rest):
                    # "```" then "```python": a decorative outer fence; this opens.
                    language, ticks = rest, stripped[: len(stripped) - len(stripped.lstrip("`"))]
                    offset += len(line)
                    i += 1
                    continue
                closed = True
                # Text after the closing backticks on the same line is prose again.
                after = len(line) - len(stripped) + len(ticks)
                end = offset + (after if rest else len(line.rstrip("\n")))
                if rest:
                    lines[i] = line[after:]
                    offset += after
                else:
                    offset += len(line)
                    i += 1
                break
            body_lines.append(replies._dedent(line, indent))
            offset += len(line)
            i += 1
        else:
            end = offset
        body = "".join(body_lines).rstrip("\n")
        fences.append(
            replies.Fence(
                language.lower(), body, start, end, closed, replies._runs(language.lower(), body)
            )
        )
    return fences


FENCE_TEXT_LINES = [
    "```repl", "```", "````", "  ```py", "   ```python", "```text", "``` ```repl", "```repl x",
    "``` trailing prose", "````` ", "x = 1", "  indented", "a ``` b", "", "\t```", "~~~",
    "FINAL(x)", "```\u00a0lang",
]  # fmt: skip


@SMALL
@given(
    lines=st.lists(st.sampled_from(FENCE_TEXT_LINES), max_size=25),
    breaks=st.lists(st.sampled_from(["\n", "\r\n", "\r", "\x0b", "\u2028", "\x1c"]), min_size=1),
    end=st.booleans(),
)
def test_fences_are_found_as_reading_every_line_found_them(lines, breaks, end):
    text = "".join(line + breaks[i % len(breaks)] for i, line in enumerate(lines))
    text = text if end else text.rstrip("\n\r\x0b\u2028\x1c")
    assert replies._fences(text) == plain_fences(text)


def test_a_megabyte_of_short_lines_is_searched_for_fences_not_walked():
    text = "x\n" * 2**19 + "```repl\n" + "y\n" * 2**18 + "```\n"
    fences, seconds = cpu_seconds(replies._fences, text)
    assert [fence.body[:3] for fence in fences] == ["y\ny"]
    assert seconds < 0.25  # line by line: 0.52 s; now 0.06 s
