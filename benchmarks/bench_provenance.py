"""Finishing by provenance: invented finishes taken, answers delayed, and what a replay
costs, side by side in one run.

Run from the repo root:  python benchmarks/bench_provenance.py [--shapes 1200]

1. Generated reply shapes (the generators of
   tests/test_answer_origin_decides_the_finish.py, drawn with a
   seeded random): a value the model typed after code that read data (must never be
   taken), a value computed from data (must be taken in its turn), a value typed after
   code that read no data (written down: must be taken in its turn). Each runs in a real
   in-process REPL and is judged by the run's own ``Finishing``; reported: how many of
   each were taken, and the time per decision.
2. The replay's cost against the block's own: a reply that counts words over a context
   of 1, 10 and 50 MB and finishes with the count, in this process; the step's seconds,
   the replay's, and their ratio.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

from tests.test_answer_origin_decides_the_finish import (  # noqa: E402
    COMPUTED,
    READS_DATA,
    READS_NOTHING,
    TYPED,
    WRAPPERS,
    finishes,
    new_repl,
    quoted,
    taken,
)

COUNT_WORDS = (
    "import collections\n"
    "words = collections.Counter(context.split())\n"
    "print(words.most_common(3))\n"
    "FINAL(words.most_common(1)[0][0])"
)


def shape(rng: random.Random, values: list[str], before: list[str]) -> list[str]:
    expr = rng.choice(values)
    for _ in range(rng.randint(0, 3)):
        expr = quoted(rng.choice(WRAPPERS), expr)
    finish = rng.choice(finishes(expr))
    pre = rng.choice(before)
    if not pre:
        return [finish]
    return [pre, finish] if rng.random() < 0.5 else [f"{pre}\n{finish}"]


async def shapes(count: int) -> None:
    rng = random.Random(38)
    classes = [
        ("typed after data read", TYPED, READS_DATA, False),
        ("computed from data", COMPUTED, READS_DATA + READS_NOTHING, True),
        ("written down, no data read", TYPED, READS_NOTHING, True),
    ]
    print(f"{'class':<30} {'shapes':>7} {'taken':>7} {'wrong':>6} {'ms/decision':>12}")
    for name, values, before, should in classes:
        wrong, took, started = 0, 0, time.perf_counter()
        for _ in range(count):
            blocks = shape(rng, values, before)
            result = await taken(blocks)
            took += result
            wrong += result is not should
        ms = (time.perf_counter() - started) / count * 1000
        print(f"{name:<30} {count:>7} {took:>7} {wrong:>6} {ms:>12.1f}")


async def replay_cost() -> None:
    print(f"\n{'context':>8} {'step s':>8} {'replay s':>9} {'ratio':>6}")
    for megabytes in (1, 10, 50):
        repl = new_repl()
        words = " ".join(f"w{i % 5000}" for i in range(200_000))
        repl.namespace["context"] = (words * (megabytes * 2**20 // len(words) + 1))[
            : megabytes * 2**20
        ]
        started = time.perf_counter()
        step = await repl.run(COUNT_WORDS, timeout=600)
        step_s = time.perf_counter() - started
        assert step.finish, step.error
        started = time.perf_counter()
        found = await repl.replay([COUNT_WORDS], timeout=600)
        replay_s = time.perf_counter() - started
        assert found.read_data and found.digests[0] is not None, found
        print(f"{megabytes:>6}MB {step_s:>8.2f} {replay_s:>9.2f} {replay_s / step_s:>6.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shapes", type=int, default=1200, help="shapes per class")
    args = parser.parse_args()
    asyncio.run(shapes(args.shapes))
    asyncio.run(replay_cost())


if __name__ == "__main__":
    main()
