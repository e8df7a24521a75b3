"""Keeping secrets out of everything sent to a model.

Values of environment variables whose names look secret (KEY, TOKEN, SECRET,
PASSWORD, ...) and the configured ``api_key`` are replaced by ``[REDACTED]``, in the
forms a secret travels in when an endpoint or a program echoes it:

- as it is, and escaped by repr() or JSON (``_spellings``);
- transformed (``_Forms``): spaced out, split across lines, with zero-width or bidi
  characters in it, percent-encoded (wholly or in part), JSON- or Python-escaped
  (``\\u00xx``, ``\\xNN``), as HTML entities, reversed, as hex (either case, spaced or
  not), and base64 (standard or URL-safe, padded or not) of the secret alone or inside
  a longer string, ``user:key`` as Basic auth sends it: at each of the three byte
  alignments a secret can have in it;
- and whatever the value of a credential header or setting that is echoed, secret or
  not: ``Authorization``, ``Proxy-Authorization``, ``x-api-key``, ``api-key``,
  ``api_key=``... (``_secrets.CREDENTIAL_NAMES``).

Transformed forms are found by searching copies of the text with its separators
dropped and its escapes decoded (``_views``) for each form spelled out once, so the
work is linear in the text: a few C passes over it (and a Python call per run of
escapes it holds), and, only when a form is there, a slower pass that maps it back to
the text.

It guards against echoes, not against code that means to hide a secret: code that has
one can still encode it some other way. That is why the sandbox gets none.

Why one module: the forms, the views of a text they are searched in and the traces that
map a found form back to the text are one search; a form added without its view (or a
view without its trace back) would redact the wrong characters or none.
"""

from __future__ import annotations

import asyncio
import base64
import bisect
import functools
import itertools
import json
import operator
import re
from collections.abc import Callable, Iterable, Iterator
from typing import Any, TypeVar

from .._secrets import CREDENTIAL_NAMES, MIN_SECRET_LENGTH, environment_secrets

T = TypeVar("T")
E = TypeVar("E", bound=BaseException)

REDACTED = "[REDACTED]"
# Above this many characters, redaction runs in a thread so the loop keeps turning: a
# text dense with escapes costs about 1 µs a character (a Python call for each escape),
# prose about 15 µs a KB.
OFF_LOOP_CHARS = 64_000

Span = tuple[int, int]


async def off_loop_if_large(size: int, redact: Callable[..., T], *args: Any) -> T:
    """Run ``redact(*args)`` here, or in a thread when it has ``size`` > OFF_LOOP_CHARS
    characters to scan."""
    if size > OFF_LOOP_CHARS:
        return await asyncio.to_thread(redact, *args)
    return redact(*args)


# -- exact spellings -------------------------------------------------------------------


@functools.lru_cache(maxsize=16)
def _pattern(secrets: frozenset[str]) -> re.Pattern[str] | None:
    if not secrets:
        return None
    # Longest first, so a secret that contains another is removed whole.
    return re.compile("|".join(re.escape(s) for s in sorted(secrets, key=len, reverse=True)))


def _spellings(secret: str) -> set[str]:
    """A secret as it may appear in output: as is, and escaped by repr() or JSON (a
    quote, backslash or non-ASCII character changes how it is printed)."""
    return {
        secret,
        repr(secret)[1:-1],
        json.dumps(secret)[1:-1],
        json.dumps(secret, ensure_ascii=False)[1:-1],
    }


# -- transformed forms: a normalised copy of the text, searched ------------------------

# Characters that may sit between a secret's characters without hiding it: whitespace
# (line breaks included), invisible format characters, quotes (a string split across
# lines) and the commas and colons of hex dumps. None of them is in base64 or hex.
_SEPARATORS = (
    " \t\n\r\f\v\x1c\x1d\x1e\x1f\x85\xa0\xad\u1680\u180e\u2000\u2001\u2002\u2003\u2004"
    "\u2005\u2006\u2007\u2008\u2009\u200a\u200b\u200c\u200d\u200e\u200f\u2028\u2029"
    "\u202a\u202b\u202c\u202d\u202e\u202f\u205f\u2060\u2061\u2062\u2063\u2064\u2066"
    "\u2067\u2068\u2069\u3000\ufeff\"'`,:"
)
_DROP_SEPARATORS = dict.fromkeys(map(ord, _SEPARATORS))
_ASCII_SEPARATORS = [c for c in _SEPARATORS if c.isascii()]
_OTHER_SEPARATORS = [c for c in _SEPARATORS if not c.isascii()]
_OTHER_SEPARATOR = re.compile(f"[{''.join(_OTHER_SEPARATORS)}]")
_SEPARATOR_RUN_KEPT = re.compile(f"([{re.escape(_SEPARATORS)}]+)")
# Escapes, decoded to what they stand for, in this order: runs of two-character ones
# ("\"", "\\", a whitespace escape such as "\n" dropped), runs of \x or percent bytes
# (UTF-8, else Latin-1), runs of \u (JSON's, surrogate pairs included), \U, HTML's
# numeric entities. Each kind is its own pattern with its own first character, which sre
# finds at C speed (an alternation of the kinds scans ten times slower), looked for only
# where that is there; a run of escapes is one Python call.
_BLANK_LETTERS: dict[int, None] = dict.fromkeys(map(ord, "nrtfvb"))  # of "\n", "\t"...
_ESCAPES: tuple[tuple[str, re.Pattern[str], Callable[[re.Match[str]], str]], ...] = (
    (
        "\\",
        re.compile(r"\\[^xuU](?:\\[^xuU])*"),
        lambda m: m.group()[1::2].translate(_BLANK_LETTERS),
    ),
    (
        "\\",
        re.compile(
            r"\\(?:x[0-9A-Fa-f]{2}(?:\\x[0-9A-Fa-f]{2})*|u[0-9A-Fa-f]{4}(?:\\u[0-9A-Fa-f]{4})*"
            r"|U[0-9A-Fa-f]{8})"
        ),
        lambda match: _decoded(match.group()),
    ),
    ("%", re.compile(r"%[0-9A-Fa-f]{2}(?:%[0-9A-Fa-f]{2})*"), lambda m: _decoded(m.group())),
    ("&#", re.compile(r"&#(?:[0-9]{1,7}|[xX][0-9A-Fa-f]{1,6});"), lambda m: _decoded(m.group())),
)


def _escape_kinds(text: str) -> list[tuple[re.Pattern[str], Callable[[re.Match[str]], str]]]:
    """The kinds of escape ``text`` has, and what each becomes."""
    return [(kind, new) for first, kind, new in _ESCAPES if first in text and kind.search(text)]


def _decoded(text: str) -> str:
    if text[0] == "%" or text[1] == "x":
        raw = bytes.fromhex(text.replace("%", "").replace("\\x", ""))
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            return raw.decode("latin-1")
    if text[1] == "u":
        decoded: str = json.loads(f'"{text}"')
        return decoded
    if text[1] == "U":
        number = int(text[2:], 16)
    else:  # &#NNN; or &#xHH;
        number = int(text[3:-1], 16) if text[2] in "xX" else int(text[2:-1])
    return chr(number) if number <= 0x10FFFF else text


def _without_separators(text: str) -> str:
    if text.isascii():
        return text.translate(_DROP_SEPARATORS)
    # str.translate leaves its fast path for any other text (170 ms a MB): a pass of
    # str.replace for each separator the text has, the rare ones looked for at once.
    others = _OTHER_SEPARATORS if _OTHER_SEPARATOR.search(text) else ()
    for separator in (*_ASCII_SEPARATORS, *others):
        if separator in text:
            text = text.replace(separator, "")
    return text


def _views(text: str) -> list[str]:
    """What transformed forms are searched in: ``text`` with its separators dropped;
    and with its escapes decoded first, once, and twice if escapes remain (an escape
    escaped: ``%2573``, ``\\&#115;``, JSON's ``\\\\n``), separators dropped after. (All of
    them: a "%" before a hex or base64 form would decode its first two characters.)"""
    views = [_without_separators(text)]
    decoded = text
    while len(views) < 3 and (kinds := _escape_kinds(decoded)):
        for kind, new in kinds:
            decoded = kind.sub(new, decoded)
        views.append(_without_separators(decoded))
    return views


class _Trace:
    """Where each stretch of a rewritten text came from in the text before it."""

    def __init__(self) -> None:
        self.starts: list[int] = []  # where each stretch starts in the rewritten text
        self.sources: list[int] = []  # ... and where it came from
        self.source_ends: list[int | None] = []  # None: copied, char for char

    def add(self, start: int, source: int, source_end: int | None) -> None:
        self.starts.append(start)
        self.sources.append(source)
        self.source_ends.append(source_end)

    def start(self, index: int) -> int:
        """Where the character at ``index`` of the rewritten text came from."""
        stretch = bisect.bisect_right(self.starts, index) - 1
        if self.source_ends[stretch] is None:
            return self.sources[stretch] + index - self.starts[stretch]
        return self.sources[stretch]

    def end(self, index: int) -> int:
        """Where what came before ``index`` of the rewritten text ended."""
        stretch = bisect.bisect_right(self.starts, index - 1) - 1
        source_end = self.source_ends[stretch]
        if source_end is None:
            return self.sources[stretch] + index - self.starts[stretch]
        return source_end


def _traced_sub(
    pattern: re.Pattern[str], replace: Callable[[re.Match[str]], str], text: str
) -> tuple[str, _Trace]:
    """``pattern.sub(replace, text)``, and where each piece of its result came from."""
    pieces: list[str] = []
    trace = _Trace()
    done = length = 0
    for match in pattern.finditer(text):
        if match.start() > done:
            trace.add(length, done, None)
            pieces.append(text[done : match.start()])
            length += match.start() - done
        new = replace(match)
        if new:
            trace.add(length, match.start(), match.end())
            pieces.append(new)
            length += len(new)
        done = match.end()
    if done < len(text):
        trace.add(length, done, None)
        pieces.append(text[done:])
    return "".join(pieces), trace


def _traced_drop(text: str) -> tuple[str, _Trace]:
    """``text`` without its separators, and where each stretch of it came from."""
    pieces = _SEPARATOR_RUN_KEPT.split(text)  # kept, separators, kept, ..., kept
    lengths = list(map(len, pieces))
    kept = lengths[::2]
    trace = _Trace()
    trace.starts = [0, *itertools.accumulate(kept[:-1])]
    trace.sources = [0, *itertools.accumulate(map(operator.add, kept[:-1], lengths[1::2]))]
    trace.source_ends = [None] * len(kept)
    return "".join(pieces[::2]), trace


class _Dropped:
    """Where each character of ``_without_separators(text)`` came from in ``text``: the
    text is counted block by block (C speed), and only a block asked about is traced
    (tracing every stretch between separators took 250 µs a KB of prose)."""

    BLOCK = 4096

    def __init__(self, text: str):
        self.text = text
        blocks = range(0, len(text), self.BLOCK)
        counts = (len(_without_separators(text[i : i + self.BLOCK])) for i in blocks)
        self.block_starts = [0, *itertools.accumulate(counts)]
        self._traces: dict[int, _Trace] = {}

    def _trace(self, block: int) -> _Trace:
        if block not in self._traces:
            start = block * self.BLOCK
            self._traces[block] = _traced_drop(self.text[start : start + self.BLOCK])[1]
        return self._traces[block]

    def start(self, index: int) -> int:
        block = bisect.bisect_right(self.block_starts, index) - 1
        local = self._trace(block).start(index - self.block_starts[block])
        return block * self.BLOCK + local

    def end(self, index: int) -> int:
        block = bisect.bisect_right(self.block_starts, index - 1) - 1
        local = self._trace(block).end(index - self.block_starts[block])
        return block * self.BLOCK + local


def _traced_views(text: str) -> list[tuple[str, list[_Trace | _Dropped]]]:
    """``_views(text)`` (the same texts: the same rewrites), each with the traces that
    map it back to ``text``, last rewrite first."""
    views: list[tuple[str, list[_Trace | _Dropped]]] = [
        (_without_separators(text), [_Dropped(text)])
    ]
    decoded, traces = text, list[_Trace | _Dropped]()
    while len(views) < 3 and (kinds := _escape_kinds(decoded)):
        for kind, new in kinds:
            decoded, escapes = _traced_sub(kind, new, decoded)
            traces = [escapes, *traces]
        views.append((_without_separators(decoded), [_Dropped(decoded), *traces]))
    return views


_URL_SAFE = str.maketrans("+/", "-_")
# Forms this long are looked for without their first four characters (see ``_Forms``):
# the 12 or more left are no ordinary text's.
_TRIMMED_FROM = 16
_TRIMMED = 4
_BASE64_EDGE = re.compile(r"[A-Za-z0-9+/_-]{1,3}\Z")  # (\Z: "$" matches before a "\n")
_BASE64_TAIL = re.compile(r"[A-Za-z0-9+/_-]{0,3}(?:=|%3[Dd]){0,2}")


def _base64_cores(raw: bytes) -> list[str]:
    """The base64 characters that spell ``raw`` whatever surrounds it: at each byte
    alignment (0, 1 or 2 bytes before it in its group of three, as ``user:key`` puts
    it), the characters whose six bits are all ``raw``'s, edges dropped."""
    cores = []
    for offset in range(3):
        encoded = base64.b64encode(bytes(offset) + raw).decode("ascii")
        first = -(-8 * offset // 6)  # the first character with none of the filler's bits
        last = 8 * (offset + len(raw)) // 6  # the first one with bits from beyond
        cores.append(encoded[first:last])
    return cores


class _Forms:
    """Every transformed form of a set of secrets, as found in a normalised text."""

    def __init__(self, secrets: Iterable[str]):
        plain: set[str] = set()
        self.base64: set[str] = set()
        widest = 0
        for secret in secrets:
            spelled = [view for view in _views(secret) if len(view) >= MIN_SECRET_LENGTH]
            if not spelled:
                continue  # loose forms of a short value would match ordinary text
            plain.update(spelled)
            plain.update(view[::-1] for view in spelled)
            raw = secret.encode("utf-8", "surrogatepass")
            widest = max(widest, len(raw))
            plain.update((raw.hex(), raw.hex().upper()))
            for core in _base64_cores(raw):
                self.base64.update((core, core.translate(_URL_SAFE)))
        # Longest first, so that a form containing another is found whole. A long form
        # is looked for without its first characters, then taken whole where they are
        # there: what comes before it may have made them part of an escape ("%" and
        # "0a", "\\" and "r", "\\u" and "73ab"), and the rest is still the secret.
        self.forms = sorted(plain | self.base64, key=len, reverse=True)
        self.needles = [
            form[_TRIMMED:] if len(form) >= _TRIMMED_FROM else form for form in self.forms
        ]
        # How far a form may reach in a text: a percent-encoded byte takes 3 characters,
        # a \u00XX escape of one 6, each with separators around it.
        self.reach = 12 * widest

    def __bool__(self) -> bool:
        return bool(self.forms)

    def spans(self, text: str) -> Iterator[Span]:
        """Where in ``text`` a form of a secret is."""
        forms = list(zip(self.forms, self.needles))
        found = [[f for f in forms if f[1] in view] for view in _views(text)]
        if not any(found):
            return
        # (Rare: a secret is there.) The same views again, traced, to say where.
        for (view, traces), present in zip(_traced_views(text), found):
            for form, needle in present:
                head = form[: len(form) - len(needle)]
                start = view.find(needle)
                while start >= 0:
                    end = start + len(needle)
                    whole = start >= len(head) and view.startswith(head, start - len(head))
                    span = (start - len(head) if whole else start, end)
                    for trace in traces:
                        span = (trace.start(span[0]), trace.end(span[1]))
                    yield self._widened(text, span) if form in self.base64 else span
                    start = view.find(needle, end)

    @staticmethod
    def _widened(text: str, span: Span) -> Span:
        """A base64 core's span with the characters at its edges that hold part of the
        secret's bits (and the padding)."""
        start, end = span
        before = _BASE64_EDGE.search(text, max(0, start - 3), start)
        after = _BASE64_TAIL.match(text, end)
        return (before.start() if before else start, after.end() if after else end)


@functools.lru_cache(maxsize=16)
def _forms(secrets: frozenset[str]) -> _Forms:
    return _Forms(secrets)


# -- credential headers and settings echoed, whatever their value ----------------------

_ASCII_LOWER = str.maketrans("ABCDEFGHIJKLMNOPQRSTUVWXYZ", "abcdefghijklmnopqrstuvwxyz")
_CREDENTIAL = re.compile(
    rf"(?:{'|'.join(CREDENTIAL_NAMES)})"
    # ": ", '": "', "=", "'='"... Each run of spaces is read once: taken whole by a
    # lookahead and matched again by reference, an atomic group that Python 3.10 takes
    # (possessive quantifiers came in 3.11).
    r"""(?:\\?["'])?(?=(?P<s1>\s*))(?P=s1)(?:[:=]|=>)(?=(?P<s2>\s*))(?P=s2)(?:\\?["'])?"""
    # the scheme stays readable
    r"(?:(?:bearer|basic|token|apikey|key|ssws)(?=(?P<s3>\s+))(?P=s3))?"
    r"""(?P<value>[^\s"'\\,;:<>{}\[\]()]{8,})""",
    re.IGNORECASE,
)
# A value that is a name in code (``self.api_key``, ``os.environ``, ``YOUR_API_KEY``):
# left, so that code reads as code. A key has digits (in 32 random characters of
# base64, but for a chance of 0.4%); a known one is redacted by the rules above anyway.
_CODE_NAME = re.compile(r"[A-Za-z_]+(?:\.[A-Za-z_]+)*")
# Each way the names above start, spelled out: found with str.find (C speed), and the
# pattern tried only there.
_CREDENTIAL_STARTS = (
    "authorization",
    *(f"api{s}key" for s in ("-", "_", "")),
    *(f"auth{s}token" for s in "-_"),
    *(f"subscription{s}key" for s in "-_"),
)


def _credential_spans(text: str) -> Iterator[Span]:
    lower = text.lower()
    if len(lower) != len(text):  # ("İ" lowers to two characters: the names would move)
        lower = text.translate(_ASCII_LOWER)
    for name in _CREDENTIAL_STARTS:
        start = lower.find(name)
        while start >= 0:
            match = _CREDENTIAL.match(text, start)
            if match is None:
                start = lower.find(name, start + len(name))
                continue
            if not _CODE_NAME.fullmatch(match["value"]):
                yield match.span("value")
            # On after the value: "api_key=api_key=..." is read once, not once a name.
            start = lower.find(name, match.end())


# -- the redactor ----------------------------------------------------------------------


class Redactor:
    """Callable that removes the current secrets from a text, in every form they
    travel in, and the values of echoed credential headers."""

    def __init__(self, extra: Iterable[str | None] = ()):
        secrets = set(environment_secrets())
        secrets.update(s for s in extra if s and len(s) >= MIN_SECRET_LENGTH)
        spellings = set().union(*map(_spellings, secrets)) if secrets else set()
        self._spellings = sorted(spellings, key=len, reverse=True)
        self._pattern = _pattern(frozenset(spellings))
        self._forms = _forms(frozenset(secrets))
        # How far past a cut a secret that starts before it may reach.
        self.reach = max(len(self._spellings[0]) if spellings else 0, self._forms.reach)

    def spans(self, text: str) -> list[Span]:
        """Where secrets are in ``text``, in order, overlapping ones merged."""
        found = list(_credential_spans(text))
        if self._pattern is not None and any(s in text for s in self._spellings):
            found += (m.span() for m in self._pattern.finditer(text))
        if self._forms:
            found += self._forms.spans(text)
        found.sort()
        merged: list[Span] = []
        for start, end in found:
            if merged and start <= merged[-1][1]:
                merged[-1] = (merged[-1][0], max(end, merged[-1][1]))
            else:
                merged.append((start, end))
        return merged

    def __call__(self, text: str) -> str:
        if not text:
            return text
        spans = self.spans(text)
        if not spans:
            return text
        return _replaced(text, spans, len(text))

    def each(self, texts: list[str]) -> list[str]:
        """``texts``, each redacted, from one pass over them joined by line breaks: a
        pass per text cost about 65 µs, 0.2-0.6 s for the 6,000 strings of a typed
        answer of 3,000 objects. A secret split across two of them is removed too."""
        joined = "\n".join(texts)
        spans = self.spans(joined) if joined else []
        if not spans:
            return texts
        redacted, start, first = [], 0, 0
        for text in texts:
            end = start + len(text)
            inside, index = [], first
            while index < len(spans) and spans[index][0] < end:
                span_start, span_end = spans[index]
                if span_end > start:
                    inside.append((max(span_start, start) - start, min(span_end, end) - start))
                index += 1
            while first < len(spans) and spans[first][1] <= end:
                first += 1  # (a span that goes on past this text is its next's too)
            redacted.append(_replaced(text, inside, len(text)) if inside else text)
            start = end + 1  # (the line break)
        return redacted

    def head(self, text: str, limit: int) -> str:
        """The first ``limit`` characters of ``text``, redacted. A secret that starts
        before the cut is removed whole; nothing from beyond the cut moves in."""
        window = text[: limit + self.reach]
        return _replaced(window, [s for s in self.spans(window) if s[0] < limit], limit)

    def __bool__(self) -> bool:
        return True  # (credential headers are redacted with no secret known)


def _replaced(text: str, spans: list[Span], limit: int) -> str:
    """``text`` up to ``limit`` with each span (starting before it) replaced whole."""
    parts, position = [], 0
    for start, end in spans:
        parts += [text[position:start], REDACTED]
        position = end
    if position < limit:
        parts.append(text[position:limit])
    return "".join(parts)


def redact_conversation(messages: list[dict[str, Any]], redactor: Redactor) -> list[dict[str, Any]]:
    """Every message as it may be sent: with secrets removed. The last line of defence:
    whatever code built the prompt, no environment secret reaches a provider."""
    if not redactor:
        return messages
    return [
        {**m, "content": redactor(m["content"])} if isinstance(m.get("content"), str) else m
        for m in messages
    ]


async def redact_messages(
    messages: list[dict[str, Any]], redactor: Redactor
) -> list[dict[str, Any]]:
    """``redact_conversation``, in a thread when the messages are large."""
    if not redactor:
        return messages
    size = sum(len(m.get("content") or "") for m in messages if isinstance(m.get("content"), str))
    return await off_loop_if_large(size, redact_conversation, messages, redactor)


def redact_failure(error: E, failure: BaseException, redactor: Redactor) -> E:
    """A provider's error text may echo the request (a 401 quoting "Bearer sk-..."): the
    message of ``error`` (raised, recorded and shown to the model's code) and the
    provider's exceptions under it (a traceback shows them) are redacted in place, as
    far as they let us."""
    redact_causes(failure, redactor)
    message = redactor(str(error))
    if message != str(error):
        error.args = (message,)
    return error


def redact_causes(failure: BaseException, redactor: Redactor) -> None:
    """``failure`` and the exceptions under it, redacted in place, as far as they let
    us: done before a message is made of them, which may cut a secret in two."""
    seen: set[int] = set()
    cause: object = failure
    while isinstance(cause, BaseException) and id(cause) not in seen:
        seen.add(id(cause))
        try:
            if isinstance(getattr(cause, "message", None), str):
                cause.message = redactor(cause.message)  # type: ignore[attr-defined]
            cause.args = tuple(redactor(a) if isinstance(a, str) else a for a in cause.args)
        except (AttributeError, TypeError):  # a read-only attribute: left as it is
            pass
        cause = cause.__cause__ or cause.__context__
