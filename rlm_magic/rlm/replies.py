"""How the root model's replies are read: the code to run, and the final answer.

One reader, used for complete replies and for replies still streaming in (early
execution), so both see the same blocks. Its rules:

**Code.** A fence is a line starting with three or more backticks, optionally indented;
it closes at the next line starting with as many backticks (text after them on that line
is prose again), or at the end of the reply. ```repl, ```python, ```py, ```python3 and
```py3 blocks run, and bare ``` blocks that parse as Python. A block that is just a
FINAL(...) line is read as the answer instead, as if written outside the fence, when it
is bare or is not valid Python (``FINAL(The answer is 42)``). Blocks in other languages
(```json, ```text) are quotations: neither run nor read for an answer.
Line endings are normalised first (CRLF, CR).

**Answer.** FINAL( or FINAL_VAR( begins a line of prose, after optional Markdown
(``**``, ``>``, ``-``, ``#``, a backtick). Its argument ends at the ')' that balances
its '('; what follows (``.``, ``**``, words) is prose. Parentheses in a "quoted" or
`quoted` span of one line, and those of emoticons (``:)``, ``;-)``, ``:( ``), do not
count. A balancing ')' that reads as a list marker or follows a percentage (after a
number or a letter that follows a space or a line start, or after a '%'; with text
following on its line: "1) ", "a) ", "5%) ") ends the answer only if no ordinary
balancing ')' comes after it. If one does, ends its line, and the markers before it
count up as one list (1) 2), a) b), i) ii); percentages pass), the answer runs to it
(``FINAL(Answer: a) yes\n\nb) no)``); otherwise the reply reads two ways and is refused
with both readings quoted, so the model restates it. When no ')' balances, the first
line ending in ')' ends the answer if it ends its paragraph. An answer ended by that
line rule or by a marker-like ')' is not ``balanced``: from a reply cut off at
max_tokens it is not taken. An empty answer, or one that never closes, is not an answer:
the reply's ``problems`` say what was seen.

Why one module: these rules read a reply together (a fence
decides what is prose, prose is where an answer may be), and each line of the rules
above has a function here and tests that quote real models' replies.
"""

from __future__ import annotations

import ast
import functools
import re
from collections.abc import Iterator
from dataclasses import dataclass, field

CODE_LANGUAGES = frozenset({"repl", "python", "py", "python3", "py3"})

# The ways to finish, as the model is told when a finish could not be read.
ACCEPTED_FORMS = (
    "on a line of its own outside code, FINAL(your answer) or FINAL_VAR(variable_name); "
    'or, inside a ```repl block, FINAL(value) or FINAL_VAR("variable_name")'
)

# The language word is taken whole (a lookahead then its backreference: a possessive
# match), or a line with a backtick at its end tried every split of it and the text
# after: 3 s for a line of 20,000 characters, now linear.
_OPENING = re.compile(r"^([ \t]*)(`{3,})[ \t]*(?=([^\s`]*))\3[^`\n]*$")
# One Markdown character per repeat: "(?:[>*]+[ \t]*)*" backtracked exponentially on a
# line of 30 '*' (minutes for one reply).
_MARKER = re.compile(r"^[ \t]*(?:[>*_#+`-][ \t]*)*(FINAL_VAR|FINAL)\(", re.MULTILINE)
_MENTION = re.compile(r"\bFINAL(?:_VAR)?\b")
_PRINTED_MARKER = re.compile(r"\s*(FINAL_VAR|FINAL)\(")
# A list marker's token before its ')': a number, a letter or a small roman numeral,
# at the start of a line (or of the answer) or after a space.
_LIST_TOKEN = re.compile(r"(?:^|(?<=[\s*_]))(\d{1,2}|[A-Za-z]|[ivx]{2,4})$", re.MULTILINE)
_ROMAN = ("i", "ii", "iii", "iv", "v", "vi", "vii", "viii", "ix", "x")
# What may change the depth of an answer's parentheses, one match each and found at C
# speed (each match starts with the text up to it): a quoted span of one line (skipped
# whole), an emoticon's parenthesis (skipped: ":)", ";-)", "=)", and ":(" before a space
# or the line's end, not "x:(y)"), a parenthesis (groups 1 and 2), a lone quote.
_EYES_BEFORE = r"(?:(?<=[:;=]{0})|(?<=[:;=]-{0})|(?<=[:;=]\n{0}))"
_PAREN_TOKENS = re.compile(
    r'[^()"`]*(?:"[^"\n]*"|`[^`\n]*`'
    + r"|\)"
    + _EYES_BEFORE.format(r"\)")
    + r"|\("
    + _EYES_BEFORE.format(r"\(")
    + r"(?=[ \t\n]|\Z)|(\()|(\))|[\"`]|\Z)"
)
# An answer whose end takes more parentheses and quoted spans than this to find is not
# read (40 ms of the kernel's loop at most; a printed marker of 3.4 MB of "a) " took 3 s).
MAX_MARKER_TOKENS = 10_000
# Markers read in one reply, and the problems with them told to the model: a MB of
# "FINAL(" lines took 1.4 s to read every one of them.
MAX_MARKERS_READ = 1_000
MAX_PROBLEMS_SHOWN = 5
# The ')' ending a line (``str.splitlines``'s line breaks, trailing spaces stripped).
_BREAKS = "\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029"
_LINE_BREAK = re.compile(f"[{_BREAKS}]")
_LINE_ENDING_IN_PAREN = re.compile(rf"\)[^\S{_BREAKS}]*(?=[{_BREAKS}]|\Z)")
_PARAGRAPH_END = re.compile(r"[ \t]*(?:\n[ \t]*(?:\n|$)|$)")
_WORD = re.compile(r"\S+")
# What may follow the answer's ')' on its line for it to end the line.
_LINE_TAIL = re.compile(r"[ \t.,;:!?*_`~]*(?:\n|$)")


@dataclass(frozen=True)
class Final:
    """A final answer written in the reply: FINAL(value) or FINAL_VAR(name)."""

    kind: str  # "FINAL" or "FINAL_VAR"
    value: str
    # False: its ')' may not be where the answer ends (the line rule read it, or a ')'
    # that reads as a list marker ended it), so a reply cut off at max_tokens is refused.
    balanced: bool = True


@dataclass(frozen=True)
class Fence:
    """A fenced block of the reply: its language, its text, where it lies."""

    language: str
    body: str
    start: int  # offset of the opening fence line in the normalised text
    end: int  # offset just past the closing fence (or the end of the text)
    closed: bool
    runnable: bool


@dataclass(frozen=True)
class Reply:
    """A reply as the run acts on it."""

    text: str  # normalised line endings
    fences: list[Fence] = field(default_factory=list)
    final: Final | None = None
    # Attempts to finish that could not be read, each said exactly, for the model.
    problems: list[str] = field(default_factory=list)

    @property
    def blocks(self) -> list[str]:
        """The code to run, in order."""
        return [fence.body for fence in self.fences if fence.runnable]


def normalise(text: str) -> str:
    return text.replace("\r\n", "\n").replace("\r", "\n")


def read_reply(text: str, *, streaming: bool = False) -> Reply:
    """Read a reply. ``streaming``: the reply is still coming in, so a block whose
    closing fence has not arrived is left out (it may not be finished)."""
    text = normalise(text)
    fences = _fences(text)
    if streaming:
        return Reply(text, [f for f in fences if f.closed])
    final, problems = _read_final(text, fences)
    return Reply(text, fences, final, problems)


def code_blocks(text: str, *, streaming: bool = False) -> list[str]:
    """The blocks of a reply that run, in order."""
    return read_reply(text, streaming=streaming).blocks


def with_code_as_pointers(text: str) -> str:
    """The reply with each runnable block replaced by "[code block N below]": for views
    that show the code itself, highlighted, right after the text."""
    text = normalise(text)
    parts, at, number = [], 0, 0
    for fence in _fences(text):
        if fence.runnable:
            number += 1
            parts += [text[at : fence.start], f"[code block {number} below]"]
            at = fence.end
    parts.append(text[at:])
    return "".join(parts).strip()


def read_printed_final(printed: str) -> Final | None:
    """The answer in a FINAL(...) / FINAL_VAR(...) that model code printed at the start
    of its text, read as in prose: up to the ')' that balances (what follows is prose)."""
    match = _PRINTED_MARKER.match(printed)
    if match is None:
        return None
    return _marker(printed, match, len(printed))[0]


def read_final_call(code: str) -> Final | None:
    """A block that is only a FINAL(...) / FINAL_VAR(...) call, read without running
    it: for a reply whose code is not run (the last chance at the iteration limit)."""
    try:
        tree = ast.parse(code)
    except (SyntaxError, ValueError):
        return None
    if len(tree.body) != 1 or not isinstance(tree.body[0], ast.Expr):
        return None
    call = tree.body[0].value
    if not (
        isinstance(call, ast.Call)
        and isinstance(call.func, ast.Name)
        and call.func.id in ("FINAL", "FINAL_VAR")
        and len(call.args) == 1
        and not call.keywords
    ):
        return None
    argument = call.args[0]
    if isinstance(argument, ast.Name):  # the variable's value, or no answer
        return Final("FINAL_VAR", argument.id)
    if not isinstance(argument, ast.Constant) or argument.value is None:
        return None  # an expression's value is not known without running it
    value = str(argument.value).strip()
    value = value if call.func.id == "FINAL" else _name(value)
    return Final(call.func.id, value) if value else None


# -- fences ------------------------------------------------------------------------------
def fences_in(text: str) -> list[Fence]:
    """The fences of a normalised ``text``, the last one perhaps not closed."""
    return _fences(text)


def _fences(text: str) -> list[Fence]:
    """The fences of ``text``, found by searching for the lines that may open or close
    one (a loop over every line took 0.34 s per MB of short lines)."""
    fences: list[Fence] = []
    offset = 0
    remainder: str | None = None  # prose after a closing fence, read as a line of its own
    while True:
        if remainder is not None:
            line, remainder = remainder, None
        else:
            candidate = _ticks_line(3).search(text, offset)
            if candidate is None:
                break
            offset = candidate.start()
            line = _line_at(text, offset)
        opening = _OPENING.match(line.rstrip("\n"))
        if opening is None:
            offset += len(line)
            continue
        indent, ticks, language = len(opening.group(1)), opening.group(2), opening.group(3)
        start = offset
        offset += len(line)
        body_start = offset
        closed = False
        while True:
            candidate = _ticks_line(len(ticks)).search(text, offset)
            if candidate is None:
                offset = end = len(text)
                break
            offset = candidate.start()
            line = _line_at(text, offset)
            stripped = line.lstrip(" \t")
            rest = stripped[len(ticks) :].strip()
            if offset == body_start and not language and re.fullmatch(r"[\w+-]+", rest):
                # "```" then "```python": a decorative outer fence; this opens.
                language, ticks = rest, stripped[: len(stripped) - len(stripped.lstrip("`"))]
                offset = body_start = offset + len(line)
                continue
            closed = True
            # Text after the closing backticks on the same line is prose again.
            after = len(line) - len(stripped) + len(ticks)
            end = offset + (after if rest else len(line.rstrip("\n")))
            body_end = offset
            if rest:
                remainder = line[after:]
                offset += after
            else:
                offset += len(line)
            break
        if not closed:
            body_end = len(text)
        body = _body(text[body_start:body_end], indent).rstrip("\n")
        fences.append(
            Fence(language.lower(), body, start, end, closed, _runs(language.lower(), body))
        )
    return fences


class _TicksLine:
    """Finds the next line (as ``str.splitlines`` splits them) that starts with
    ``ticks`` backticks after its indentation: the line break before it is searched for
    (a pattern that looked behind at each character took twice as long)."""

    def __init__(self, ticks: int):
        self.first = re.compile(f"[ \t]*`{{{ticks}}}")
        self.after_break = re.compile(f"[{_BREAKS}]([ \t]*`{{{ticks}}})")

    def search(self, text: str, start: int) -> re.Match[str] | None:
        """The line's match, from ``start``, a line's start."""
        if start == 0:
            first = self.first.match(text)
            if first is not None:
                return first
        found = self.after_break.search(text, max(start - 1, 0))
        return None if found is None else self.first.match(text, found.start(1))


@functools.lru_cache(maxsize=64)
def _ticks_line(ticks: int) -> _TicksLine:
    return _TicksLine(ticks)


def _line_at(text: str, start: int) -> str:
    """The line of ``text`` that starts at ``start``, with its line break."""
    found = _LINE_BREAK.search(text, start)
    if found is None:
        return text[start:]
    end = found.end()
    if found.group() == "\r" and text.startswith("\n", end):
        end += 1
    return text[start:end]


def _body(lines: str, indent: int) -> str:
    if not indent:
        return lines
    return "".join(_dedent(line, indent) for line in lines.splitlines(keepends=True))


def _dedent(line: str, indent: int) -> str:
    """A body line without the fence's own indentation (a fence inside a list)."""
    removable = len(line) - len(line.lstrip(" "))
    return line[min(indent, removable) :]


def _runs(language: str, body: str) -> bool:
    if _is_quotation(language) or not body.strip():
        return False
    if _is_lone_marker(body):  # FINAL(...) alone: code only where it is code
        return bool(language) and _parses(body)
    return bool(language) or _parses(body)


def _is_lone_marker(body: str) -> bool:
    """Whether a block holds one FINAL(...) / FINAL_VAR(...) and nothing else."""
    body = body.strip()
    match = _MARKER.match(body)
    if match is None:
        return False
    try:
        end, _, _ = _argument_end(body[match.end() :])
    except _TooLong:
        return False
    return end is not None and match.end() + end == len(body) - 1


def _parses(code: str) -> bool:
    try:
        ast.parse(code)
    except (SyntaxError, ValueError):
        return False
    return True


def _is_quotation(language: str) -> bool:
    return bool(language) and language not in CODE_LANGUAGES


# -- the final answer -------------------------------------------------------------------
def _read_final(text: str, fences: list[Fence]) -> tuple[Final | None, list[str]]:
    """The first answer in the reply's prose, and what was seen of failed attempts: at
    most ``MAX_MARKERS_READ`` markers read and ``MAX_PROBLEMS_SHOWN`` problems said."""
    problems: list[str] = []
    has_code = any(f.runnable for f in fences)
    read = 0
    for segment in _prose(text, fences):
        markers = _MARKER.finditer(segment)
        match = next(markers, None)
        while match is not None:
            if read == MAX_MARKERS_READ:
                return None, _shown(problems, capped=True)
            following = next(markers, None)
            limit = following.start() if following is not None else len(segment)
            final, problem = _marker(segment, match, limit)
            read += 1
            if final is not None:
                return final, _shown(problems)
            problems.append(problem)
            match = following
    if not problems and not has_code:
        problems += _mentions(text, fences)
    return None, _shown(problems)


def _shown(problems: list[str], capped: bool = False) -> list[str]:
    """The first problems, and one line for the rest."""
    shown = problems[:MAX_PROBLEMS_SHOWN]
    if len(problems) > MAX_PROBLEMS_SHOWN:
        shown.append(f"({len(problems) - MAX_PROBLEMS_SHOWN:,} more like these.)")
    if capped:
        shown.append(
            f"Your reply holds more than {MAX_MARKERS_READ:,} FINAL markers; those past "
            "them were not read. Give one answer, on a line of its own."
        )
    return shown


def _prose(text: str, fences: list[Fence]) -> list[str]:
    """The reply's text outside code and quotations; a bare block that is not code is
    prose (so FINAL(...) inside a plain ``` fence is read)."""
    segments, at = [], 0
    for fence in fences:
        if fence.runnable or _is_quotation(fence.language):
            segments.append(text[at : fence.start])
            at = fence.end
    segments.append(text[at:])
    return segments


def _marker(segment: str, match: re.Match[str], limit: int) -> tuple[Final | None, str]:
    kind, start = match.group(1), match.end()
    area = segment[start:limit]
    try:
        end, balanced, readings = _argument_end(area)
    except _TooLong:
        return None, (
            f"Your {kind}(...) holds more than {MAX_MARKER_TOKENS:,} parentheses and "
            "quotes, too many to read where it ends, so no answer was read from it. Put the "
            'answer in a variable in a ```repl block and finish with FINAL_VAR("variable_name").'
        )
    if readings:
        short, long = (_quote(area, 80, 0, index) for index in readings)
        return None, (
            f"Your {kind}(...) can be read two ways, as {short} or as {long}, "
            f"so no answer was read from it. Put the answer in a variable in a "
            f'```repl block and finish with FINAL_VAR("variable_name").'
        )
    if end is None:
        seen = _quote(segment, 160, match.start(), limit)
        return None, (
            f"Your {kind}( is never closed, so no answer was read from it: "
            f"{seen}. Accepted forms: {ACCEPTED_FORMS}."
        )
    argument = area[:end]
    if kind == "FINAL":
        value = _unquote(argument.strip())
        if not value.strip():
            return None, (
                f"Your FINAL({argument}) holds no answer, so the run goes on. "
                f"Accepted forms: {ACCEPTED_FORMS}."
            )
        return Final(kind, value, balanced), ""
    name = _name(argument)
    if not name.isidentifier():
        return None, (
            f"FINAL_VAR takes the name of a REPL variable, and "
            f"{_quote(argument.strip())} is not a name. Put the value in a "
            f"variable first, or write FINAL(your answer). Accepted forms: "
            f"{ACCEPTED_FORMS}."
        )
    return Final(kind, name, balanced), ""


def _argument_end(area: str) -> tuple[int | None, bool, tuple[int, int] | None]:
    """Where the argument after "FINAL(" ends in ``area``, whether a balancing ')' ends
    it, and, when it reads two ways, where each reading ends (the end is then None).
    Reads only as far as it must (``_TooLong`` past ``MAX_MARKER_TOKENS`` tokens)."""
    closers = _closers(area)
    opening = next(closers, None)
    if opening is not None:
        first, marker = opening
        if marker is None:
            return first, True, None
        skipped = [marker]
        for index, marker in closers:
            if marker is None:  # an ordinary ')' after marker-like ones: a longer reading
                if _counts_up(skipped) and _LINE_TAIL.match(area, index + 1):
                    return index, True, None  # FINAL(Answer: a) yes\n\nb) no)
                return None, True, (first, index)
            skipped.append(marker)
        return first, False, None  # FINAL(42) is my answer, step 2) above.
    line_end = _first_line_ending_in_paren(area)
    if line_end is not None and _ends_paragraph(area, line_end):
        return line_end, False, None  # an unmatched "(" in the answer, such as "(red"
    return None, False, None


class _TooLong(Exception):
    """An answer whose end is more than ``MAX_MARKER_TOKENS`` tokens away."""


def _closers(area: str) -> Iterator[tuple[int, str | None]]:
    """Each ')' of ``area`` that balances the "FINAL(" before it, with what makes it read
    as a list marker or a percentage ("1", "a", "ii", "%"), or None. Parentheses in a
    quoted span of one line and those of emoticons do not count. Raises ``_TooLong``
    past ``MAX_MARKER_TOKENS`` tokens: the scan is a regex's, the depth Python's."""
    depth = 0
    for count, token in enumerate(_PAREN_TOKENS.finditer(area)):
        if count == MAX_MARKER_TOKENS:
            raise _TooLong
        paren = token.lastindex
        if paren == 1:
            depth += 1
        elif paren == 2:
            if depth:
                depth -= 1
            else:
                index = token.end() - 1
                yield index, _marker_token(area, index)


def _marker_token(area: str, index: int) -> str | None:
    """ "1", "a", "ii" for a list marker's ')', "%" for a percentage's; text must follow it
    on its line (Markdown emphasis may close first: "**1)** ")."""
    if area[index + 1 : index + 2] not in (" ", "\t", "*", "_"):
        return None
    if area[index - 1 : index] == "%":
        return "%"
    token = _LIST_TOKEN.search(area, max(0, index - 4), index)
    return token.group(1) if token else None


def _counts_up(markers: list[str]) -> bool:
    """Whether list markers read as one list, each the first of its kind (1, a, i) or
    the one after the last of its kind (1) 2), a) b), i) ii)); percentages pass."""
    last: dict[str, int] = {}
    for marker in markers:
        readings = []
        if marker.isdigit():
            readings.append(("number", int(marker)))
        if marker.lower() in _ROMAN and marker in (marker.lower(), marker.upper()):
            readings.append(("roman" + marker[0].isupper() * "!", _ROMAN.index(marker.lower()) + 1))
        if len(marker) == 1 and marker.isalpha():
            readings.append(("letter" + marker.isupper() * "!", ord(marker.lower()) - 96))
        fitting = [(kind, n) for kind, n in readings if n == 1 or last.get(kind) == n - 1]
        if marker != "%" and not fitting:
            return False
        last.update(fitting)
    return True


def _first_line_ending_in_paren(area: str) -> int | None:
    found = _LINE_ENDING_IN_PAREN.search(area)
    return found.start() if found else None


def _ends_paragraph(area: str, index: int) -> bool:
    """Whether the line ending at ``index`` is the last of its paragraph."""
    return _PARAGRAPH_END.match(area, index + 1) is not None


def _mentions(text: str, fences: list[Fence]) -> list[str]:
    """A reply with no code and no readable answer that still names FINAL: say where
    (mid-sentence, inside a quotation, without parentheses), so the model can fix it."""
    for fence in fences:
        if _is_quotation(fence.language) and _MARKER.search(fence.body):
            return [
                f"Your FINAL is inside a ```{fence.language} block, where it is "
                f"not read. Accepted forms: {ACCEPTED_FORMS}."
            ]
    mention = _MENTION.search(text)  # (found whole, its line then: a loop over lines was slow)
    if mention is None:
        return []
    start = max(text.rfind(character, 0, mention.start()) for character in _BREAKS) + 1
    after = _LINE_BREAK.search(text, mention.end())
    line = text[start : after.start() if after is not None else len(text)]
    return [
        f"FINAL was not read as your answer in {_quote(line.strip())}: it "
        f"must begin a line and hold the answer in parentheses. Accepted "
        f"forms: {ACCEPTED_FORMS}."
    ]


def _quote(text: str, limit: int = 160, start: int = 0, end: int | None = None) -> str:
    """``text[start:end]`` with its spaces collapsed, cut at ``limit`` characters; its
    words read only as far as the limit (a quote of megabytes was built whole)."""
    words, size = [], -1
    for word in _WORD.finditer(text, start, len(text) if end is None else end):
        words.append(word.group())
        size += len(words[-1]) + 1
        if size > limit:
            break
    quoted = " ".join(words)
    return repr(quoted if len(quoted) <= limit else quoted[:limit] + "...")


def _name(argument: str) -> str:
    return argument.strip().strip("'\"` ").strip()


def _unquote(value: str) -> str:
    """The answer without quotes around the whole of it (and only the whole of it:
    '"a" and "b"' keeps its own)."""
    for quote in ('"""', "'''", '"', "'", "`"):
        inner = value[len(quote) : -len(quote)]
        if (
            len(value) >= 2 * len(quote)
            and value.startswith(quote)
            and value.endswith(quote)
            and quote not in inner
        ):
            return inner
    return value
