"""Long-context tasks, generated: each item a context, a question, the expected answer and
how to score an answer, made from a seed so that every run of the same task, size and
seed asks exactly the same.

Sizes are in tokens as rlm-magic estimates them before a model's usage says otherwise
(``DEFAULT_CHARS_PER_TOKEN`` characters a token): an item of size 64k has about 256k
characters. Every context is lines of text, so a chunked method can split it anywhere.

The built-in tasks, after the RLM paper's (Zhang, Kraska and Khattab, 2025) and the
benchmarks it uses; each states its source (``Task.source``):

- ``niah``: one needle in a haystack (S-NIAH, as in RULER): a "special magic number"
  sentence at a depth drawn from the seed, among filler sentences;
- ``count``, ``most_common``, ``compare``: OOLONG-style aggregation over labelled
  records (here the labels are written out, so the task is aggregation over the whole
  context, not classification); a count scores as OOLONG's do, 0.75 ** |error|;
- ``pairs``: OOLONG-Pairs-style: every pair of users who both have a record with a rare
  label (quadratic in what must be kept in mind);
- ``two_hop``: two facts far apart (one in the first quarter, one in the last), among
  distractor facts of the same shape: who works where, and where that company sits.

A task of one's own: ``custom_task(name, [(context, question, expected), ...], scorer)``.

Why one module: the tasks share their generators (seeded filler, records, insertion at
a depth) and their sizing; each task is a short function over them, read side by side.
"""

from __future__ import annotations

import random
import re
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..errors import ConfigError
from ..llm.profiles import DEFAULT_CHARS_PER_TOKEN
from . import scorers
from .scorers import Scorer

CHARS_PER_TOKEN = int(DEFAULT_CHARS_PER_TOKEN)


@dataclass(frozen=True)
class Item:
    """One question of a task, at one size: what each method is asked."""

    task: str
    size: int  # tokens asked for (estimated); 0: an item given as it is (a custom task)
    index: int
    context: str
    question: str
    expected: Any
    scorer: Scorer = field(repr=False, compare=False)
    # Where the answer hides (character offsets, depths) and other facts of the item.
    facts: dict[str, Any] = field(default_factory=dict, compare=False)

    @property
    def tokens(self) -> int:
        return estimate_tokens(self.context)


@dataclass(frozen=True)
class Task:
    """A named generator of items. ``make(size, index, seed)`` builds one item."""

    name: str
    source: str
    make: Callable[[int, int, int], Item] = field(repr=False)
    fixed_items: int | None = None  # a custom task's: its items, whatever the size

    def items(self, size: int, n: int, seed: int = 0) -> list[Item]:
        count = n if self.fixed_items is None else min(n, self.fixed_items)
        return [self.make(size, index, seed) for index in range(count)]

    def count(self, n: int) -> int:
        return n if self.fixed_items is None else min(n, self.fixed_items)


def estimate_tokens(text: str) -> int:
    return int(len(text) / CHARS_PER_TOKEN)


def parse_size(size: int | str) -> int:
    """Tokens from ``8000``, ``"8k"``, ``"1M"``, ``"64K"``."""
    if isinstance(size, int):
        if size < 1:
            raise ConfigError(f"a task size must be >= 1 token, got {size}")
        return size
    found = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kKmM]?)\s*", str(size))
    if found is None:
        raise ConfigError(f"cannot read the task size {size!r}: use e.g. 8000, 8k, 64k or 1M")
    scale = {"": 1, "k": 1_000, "m": 1_000_000}[found.group(2).lower()]
    return parse_size(int(float(found.group(1)) * scale))


def size_label(tokens: int) -> str:
    if tokens >= 1_000_000 and tokens % 1_000_000 == 0:
        return f"{tokens // 1_000_000}M"
    if tokens >= 1_000 and tokens % 1_000 == 0:
        return f"{tokens // 1_000}k"
    return str(tokens)


def _rng(task: str, size: int, index: int, seed: int) -> random.Random:
    # A str seed is hashed with SHA-512 by random: the same on every run and machine.
    return random.Random(f"{task}:{size}:{index}:{seed}")


# -- filler text ---------------------------------------------------------------------

_SUBJECTS = (
    "The old ferry",
    "A quiet engineer",
    "The village choir",
    "Our neighbour",
    "The night train",
    "A patient gardener",
    "The museum guide",
    "A young chemist",
    "The harbour master",
    "A travelling painter",
    "The bakery owner",
    "A retired pilot",
)
_VERBS = (
    "repaired",
    "described",
    "painted",
    "carried",
    "measured",
    "photographed",
    "admired",
    "ignored",
    "rearranged",
    "sketched",
    "polished",
    "remembered",
)
_OBJECTS = (
    "the wooden bridge",
    "a pile of letters",
    "the broken clock",
    "an empty teapot",
    "the lighthouse stairs",
    "a box of maps",
    "the blue umbrella",
    "the garden gate",
    "a jar of buttons",
    "the long corridor",
    "a stack of chairs",
    "the copper kettle",
)
_WHEN = (
    "before breakfast",
    "after the storm",
    "on a grey morning",
    "late in the evening",
    "during the festival",
    "while it rained",
    "at the end of summer",
    "in the spring",
)


def _filler_line(rng: random.Random) -> str:
    return (
        f"{rng.choice(_SUBJECTS)} {rng.choice(_VERBS)} {rng.choice(_OBJECTS)} {rng.choice(_WHEN)}."
    )


def _filler(rng: random.Random, characters: int) -> list[str]:
    lines, total = [], 0
    while total < characters:
        line = _filler_line(rng)
        lines.append(line)
        total += len(line) + 1
    return lines


def _insert(lines: list[str], depth: float, line: str) -> int:
    """Put ``line`` at ``depth`` (0..1) of ``lines``; returns its line number."""
    at = min(len(lines), max(0, round(depth * len(lines))))
    lines.insert(at, line)
    return at


def _offset(lines: list[str], line_number: int) -> int:
    return sum(len(line) + 1 for line in lines[:line_number])


# -- single needle in a haystack (S-NIAH) ---------------------------------------------

_KEYS = (
    "amber-falcon",
    "silent-river",
    "copper-moth",
    "velvet-orbit",
    "granite-owl",
    "hollow-pine",
    "scarlet-tide",
    "paper-comet",
    "frozen-lantern",
    "quiet-meadow",
)


def _niah(size: int, index: int, seed: int) -> Item:
    rng = _rng("niah", size, index, seed)
    key = f"{rng.choice(_KEYS)}-{rng.randint(10, 99)}"
    number = str(rng.randint(1_000_000, 9_999_999))
    needle = f"The special magic number for {key} is {number}."
    lines = _filler(rng, size * CHARS_PER_TOKEN - len(needle))
    depth = rng.uniform(0.02, 0.98)
    line_number = _insert(lines, depth, needle)
    return Item(
        "niah",
        size,
        index,
        "\n".join(lines),
        f"What is the special magic number for {key}? Answer with the number only.",
        number,
        scorers.exact,
        {"needle": needle, "depth": depth, "offset": _offset(lines, line_number)},
    )


# -- labelled records (OOLONG-style) --------------------------------------------------

_TOPICS = ("sports", "weather", "cooking", "music", "travel", "finance", "gardening", "health")
_RECORD_TEXT = {
    "sports": ("the match went to extra time", "our team trained in the rain"),
    "weather": ("the forecast promised sun again", "a cold front is moving in"),
    "cooking": ("the soup needed more salt", "I baked bread with rye flour"),
    "music": ("the new album sounds warmer", "we rehearsed the second movement"),
    "travel": ("the ferry to the island was late", "I booked a night train south"),
    "finance": ("the quarterly report is out", "interest rates rose a little"),
    "gardening": ("the tomatoes finally ripened", "I planted garlic by the fence"),
    "health": ("my knee feels better after physio", "I walk ten thousand steps a day"),
}


def _records(
    rng: random.Random, characters: int, weights: Sequence[float], users: int = 500
) -> list[tuple[int, str, str]]:
    """(user, topic, line) records filling ``characters``, numbered in order."""
    records: list[tuple[int, str, str]] = []
    total = 0
    while total < characters:
        topic = rng.choices(_TOPICS, weights)[0]
        user = rng.randint(1, users)
        line = (
            f"[{len(records) + 1:06d}] user {user} | topic: {topic} | "
            f"{rng.choice(_RECORD_TEXT[topic])}"
        )
        records.append((user, topic, line))
        total += len(line) + 1
    return records


def _weights(rng: random.Random) -> list[float]:
    # One topic clearly ahead, so "the most common" has one answer at every size.
    weights = [rng.uniform(0.6, 1.0) for _ in _TOPICS]
    weights[rng.randrange(len(_TOPICS))] = 1.6
    return weights


def _count(size: int, index: int, seed: int) -> Item:
    rng = _rng("count", size, index, seed)
    records = _records(rng, size * CHARS_PER_TOKEN, _weights(rng))
    topic = rng.choice(_TOPICS)
    expected = sum(1 for _, t, _ in records if t == topic)
    return Item(
        "count",
        size,
        index,
        "\n".join(line for _, _, line in records),
        f"How many records have the topic '{topic}'? Answer with a number only.",
        expected,
        scorers.oolong_numeric,  # partial credit, 0.75 ** |error|, as OOLONG scores
        {"topic": topic, "records": len(records)},
    )


def _most_common(size: int, index: int, seed: int) -> Item:
    rng = _rng("most_common", size, index, seed)
    records = _records(rng, size * CHARS_PER_TOKEN, _weights(rng))
    tally = Counter(t for _, t, _ in records).most_common()
    if len(tally) > 1 and tally[0][1] == tally[1][1]:  # a tie at a tiny size: break it
        records.append(
            (0, tally[0][0], f"[{len(records) + 1:06d}] user 0 | topic: {tally[0][0]} | extra")
        )
    return Item(
        "most_common",
        size,
        index,
        "\n".join(line for _, _, line in records),
        "Which topic do the most records have? Answer with the topic only.",
        tally[0][0],
        scorers.exact,
        {"tally": dict(Counter(t for _, t, _ in records))},
    )


def _compare(size: int, index: int, seed: int) -> Item:
    rng = _rng("compare", size, index, seed)
    records = _records(rng, size * CHARS_PER_TOKEN, [1.0] * len(_TOPICS))
    first, second = rng.sample(_TOPICS, 2)
    tally = Counter(t for _, t, _ in records)
    if tally[first] == tally[second]:
        records.append((0, first, f"[{len(records) + 1:06d}] user 0 | topic: {first} | extra"))
        tally[first] += 1
    return Item(
        "compare",
        size,
        index,
        "\n".join(line for _, _, line in records),
        f"Do more records have the topic '{first}' or the topic '{second}'? "
        "Answer with the topic only.",
        first if tally[first] > tally[second] else second,
        scorers.exact,
        {"tally": {first: tally[first], second: tally[second]}},
    )


# -- pairs (OOLONG-Pairs-style) -------------------------------------------------------


def _pairs(size: int, index: int, seed: int) -> Item:
    rng = _rng("pairs", size, index, seed)
    users = sorted(rng.sample(range(1, 501), rng.randint(4, 6)))
    rare_line = "I saw Jupiter's moons through the telescope"
    records = _records(rng, size * CHARS_PER_TOKEN - len(users) * 80, [1.0] * len(_TOPICS))
    rare = "astronomy"
    positions = []
    for user in users:
        at = rng.randrange(len(records) + 1)
        records.insert(
            at,
            (
                user,
                rare,
                f"[{0:06d}] user {user} | topic: {rare} | {rare_line}",
            ),
        )
        positions.append(at)
    lines = [f"[{n + 1:06d}]{line[8:]}" for n, (_, _, line) in enumerate(records)]
    expected = {f"{a}-{b}" for i, a in enumerate(users) for b in users[i + 1 :]}
    return Item(
        "pairs",
        size,
        index,
        "\n".join(lines),
        f"List every pair of users who both have a record with the topic '{rare}'. "
        "Answer with the pairs as user numbers joined by a dash, the smaller first "
        "(e.g. 12-40), separated by commas.",
        expected,
        scorers.set_overlap(scorers.dash_pairs),
        {"users": users},
    )


# -- two facts far apart --------------------------------------------------------------

_FIRST = (
    "Alice",
    "Bruno",
    "Chiara",
    "Dmitri",
    "Elena",
    "Farid",
    "Greta",
    "Hiro",
    "Ines",
    "Jonas",
    "Keiko",
    "Lars",
    "Mina",
    "Nadia",
    "Oskar",
    "Priya",
)
_LAST = (
    "Varga",
    "Okafor",
    "Lindqvist",
    "Moreau",
    "Tanaka",
    "Silva",
    "Novak",
    "Haddad",
    "Kowalski",
    "Brennan",
    "Costa",
    "Weber",
)
_COMPANIES = (
    "Veltrix",
    "Orbanel",
    "Quillon",
    "Marrowind",
    "Tesserak",
    "Lumora",
    "Brightsail",
    "Cindervale",
    "Holloway Labs",
    "Northmere",
    "Kestrel Works",
    "Pellucid",
)
_CITIES = (
    "Lisbon",
    "Tallinn",
    "Osaka",
    "Montreal",
    "Nairobi",
    "Valparaiso",
    "Krakow",
    "Auckland",
    "Bergen",
    "Porto",
    "Hanoi",
    "Marseille",
)


def _two_hop(size: int, index: int, seed: int) -> Item:
    rng = _rng("two_hop", size, index, seed)
    people = rng.sample([f"{f} {la}" for f in _FIRST for la in _LAST], 4)
    companies = rng.sample(_COMPANIES, 4)
    cities = rng.sample(_CITIES, 4)
    works = [f"{p} works for {c}." for p, c in zip(people, companies)]
    sits = [f"{c} has its headquarters in {city}." for c, city in zip(companies, cities)]
    lines = _filler(rng, size * CHARS_PER_TOKEN - sum(map(len, works + sits)))
    # The asked-about pair: its first fact early, its second late; distractors anywhere.
    first_depth, second_depth = rng.uniform(0.02, 0.25), rng.uniform(0.75, 0.98)
    for fact in works[1:] + sits[1:]:
        _insert(lines, rng.uniform(0.0, 1.0), fact)
    second_line = _insert(lines, second_depth, sits[0])
    first_line = _insert(lines, first_depth, works[0])
    second_line += first_line <= second_line
    return Item(
        "two_hop",
        size,
        index,
        "\n".join(lines),
        f"In which city is the headquarters of the company {people[0]} works for? "
        "Answer with the city only.",
        cities[0],
        scorers.exact,
        {
            "facts": (works[0], sits[0]),
            "offsets": (_offset(lines, first_line), _offset(lines, second_line)),
        },
    )


BUILT_IN: dict[str, Task] = {
    task.name: task
    for task in (
        Task("niah", "S-NIAH: RULER (Hsieh et al., 2024), as in the RLM paper", _niah),
        Task("count", "OOLONG (Bertsch et al., 2025): counting labelled records", _count),
        Task("most_common", "OOLONG (Bertsch et al., 2025): the most common label", _most_common),
        Task("compare", "OOLONG (Bertsch et al., 2025): comparing two labels' counts", _compare),
        Task("pairs", "OOLONG-Pairs (RLM paper, Zhang et al., 2025): pairs of users", _pairs),
        Task("two_hop", "two-hop retrieval, facts far apart (as in BABILong / HotpotQA)", _two_hop),
    )
}
DEFAULT_TASKS = ("niah", "count", "pairs", "two_hop")


def custom_task(
    name: str,
    items: Iterable[tuple[str, str, Any]],
    scorer: Scorer | None = None,
    source: str = "user-supplied",
) -> Task:
    """A task of one's own: ``items`` are ``(context, question, expected)``; ``scorer``
    (default ``scorers.exact``) takes ``(answer, expected)`` and returns 0..1. Its items
    are asked as given, at every size (their size is their own)."""
    given = [(str(c), str(q), e) for c, q, e in items]
    if not given:
        raise ConfigError(f"custom task {name!r} has no items")
    score = scorer or scorers.exact

    def make(size: int, index: int, seed: int) -> Item:
        context, question, expected = given[index]
        return Item(name, 0, index, context, question, expected, score)

    return Task(name, source, make, fixed_items=len(given))


def resolve(tasks: Iterable[str | Task] | str | None) -> list[Task]:
    """Tasks by name (``"niah,count"``, a list of names, or ``Task`` objects)."""
    if tasks is None:
        tasks = DEFAULT_TASKS
    if isinstance(tasks, str):
        tasks = [name.strip() for name in tasks.split(",") if name.strip()]
    found = []
    for task in tasks:
        if isinstance(task, Task):
            found.append(task)
            continue
        if task not in BUILT_IN:
            raise ConfigError(
                f"unknown task {task!r}: choose from {', '.join(BUILT_IN)}, or pass a "
                "custom_task(...)"
            )
        found.append(BUILT_IN[task])
    return found
