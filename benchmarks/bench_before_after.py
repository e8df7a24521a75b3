"""bench_transport.py's targets for two checkouts of rlm_magic, side by side in one run.

Run from the repo root (``--before``: a checkout of the earlier code, e.g.
``git worktree add /tmp/before HEAD~3`` or ``git archive HEAD~3 rlm_magic | tar -x -C
/tmp/before``):

    python benchmarks/bench_before_after.py --before /tmp/before [--rounds 3]
        [--official-python /tmp/rlms/bin/python] [--calls 1000]

Each round runs ``bench_transport.py --only floor,rlm --quick`` on the earlier code and
on this one, taking turns (so a machine that gets busier midway weighs on both alike),
each in a process of its own, and the official RLM library's scripted run
(``bench_official_rlm.py``) when its interpreter is given. Reported: the median over the
rounds of each figure, before and now:

- CPU per call over raw aiohttp's, measured beside it in the same process (target: at
  most 1.5x);
- the streamed scripted RLM run over its ideal (two root turns and one sub-call; target
  at most 1.03x) and over its floor (the same 64 streamed sub-calls by raw aiohttp);
- that run's time over the official library's on the same scripted run (target: at most
  0.30x).

Measured 2 Dec 2026 on the 2-core machine shared with ~7 other sessions (load average
11-20 throughout: absolute times are high for everyone, the ratios are the steadier
figures), 2 rounds, ``--official-python`` with rlms 0.1.3; before: f0ceaf3, now: the
streaming path read once and client.py split (d471c80..d699e1a), with the other work
then in the tree:

| figure | target | before | now |
|---|---:|---:|---:|
| streamed ``LLMClient.complete`` CPU / raw aiohttp's | 1.50x | 1.61x | 1.52x |
| streamed ``llm_query_batch`` CPU / raw aiohttp's | 1.50x | 1.70x | 1.55x |
| unstreamed ``LLMClient.complete`` CPU / raw aiohttp's | 1.50x | 1.87x | 2.15x |
| unstreamed ``llm_query_batch`` CPU / raw aiohttp's | 1.50x | 1.86x | 2.06x |
| streamed scripted RLM run / its ideal (1.3 s) | 1.03x | 2.25x | 1.55x |
| the same run / its floor (raw aiohttp's fan-out) | | 1.22x | 0.90x |
| the same run / the official library's | 0.30x | 0.40x | 0.27x |

(At this load the run's floor itself is 1.7x its ideal: 64 streams at once take the
server and the machine ~1 s, not 0.3 s.) Instructions per call, callgrind
(``bench_instructions.py``, 300 calls, the same day): raw aiohttp 780k unstreamed and
1,066k streamed; ``LLMClient.complete`` 1,506k -> 1,348k unstreamed (1.94x -> 1.73x),
1,597k -> 1,659k streamed (1.50x -> 1.56x); ``llm_query_batch`` streamed 1,519k ->
1,515k (1.43x -> 1.42x). The counts move by a few percent between runs too (how many
network reads an answer arrives in depends on timing).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TARGETS = {
    "streamed LLMClient.complete gather / raw": 1.5,
    "streamed llm_query_batch / raw": 1.5,
    "unstreamed LLMClient.complete gather / raw": 1.5,
    "unstreamed llm_query_batch / raw": 1.5,
    "rlm wire / ideal": 1.03,
    "rlm wire / official": 0.30,
}


def transport_figures(code: Path | None, args: argparse.Namespace) -> dict[str, float]:
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        command = [
            sys.executable,
            str(ROOT / "benchmarks" / "bench_transport.py"),
            "--only",
            "floor,rlm",
            "--quick",
            f"--calls={args.calls}",
            "--json",
            out.name,
        ]
        if code is not None:
            command += ["--code", str(code)]
        subprocess.run(command, cwd=ROOT, check=True, stdout=subprocess.DEVNULL)
        figures: dict[str, float] = json.loads(Path(out.name).read_text())
        return figures


def official_best(args: argparse.Namespace) -> float:
    done = subprocess.run(
        [
            args.official_python,
            str(ROOT / "benchmarks" / "bench_official_rlm.py"),
            "--server-python",
            sys.executable,
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    return min(json.loads(done.stdout.strip().splitlines()[-1])["walls"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", required=True, help="a checkout of the earlier code")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--calls", type=int, default=1000)
    parser.add_argument("--official-python", help="an interpreter with rlms installed")
    args = parser.parse_args()
    runs: dict[str, list[dict[str, float]]] = {"before": [], "now": []}
    for round_ in range(args.rounds):
        official = official_best(args) if args.official_python else None
        for name, code in (("before", Path(args.before)), ("now", None)):
            figures = transport_figures(code, args)
            if official is not None:
                # bench_transport keeps the best wire run's ratio to its ideal; its wall
                # is the ideal times that ratio.
                ideal = 2 * 0.5 + 0.3
                figures["rlm wire / official"] = figures["rlm wire / ideal"] * ideal / official
            runs[name].append(figures)
            print(f"round {round_ + 1} {name}: {json.dumps(figures)}", file=sys.stderr)
    print(f"# Before and now, medians of {args.rounds} rounds taking turns\n")
    print("| figure | target | before | now |")
    print("|---|---:|---:|---:|")
    names = [name for name in runs["now"][0] if name in TARGETS or "/ floor" in name]
    for name in names:
        before = statistics.median(r[name] for r in runs["before"] if name in r)
        now = statistics.median(r[name] for r in runs["now"])
        target = f"{TARGETS[name]:.2f}x" if name in TARGETS else ""
        print(f"| {name} | {target} | {before:.2f}x | {now:.2f}x |")


if __name__ == "__main__":
    main()
