"""Instructions per call against raw aiohttp's, counted by callgrind: the CPU-per-call
figure of bench_transport.py's floor section, without the noise of a shared machine.

Run from the repo root (valgrind installed):

    python benchmarks/bench_instructions.py [--before /path/to/earlier/checkout]
        [--calls 500] [--methods 'raw aiohttp, streamed;LLMClient.complete, streamed']

Each method runs in a process of its own under ``valgrind --tool=callgrind``, against
the local server in a process outside valgrind: 64 calls of warm-up uncounted, then
``--calls`` calls at concurrency 64 counted (instrumentation turned on and off around
them by ``callgrind_control``: start-up, imports and the warm-up are not counted).
Process CPU time on a machine shared with other sessions moves by 30% from run to run
(load average 8-20 here); instruction counts move by a few percent. Time is not
instructions (a cache miss costs more than an add), so this is the steadier of the two
figures, not a replacement: bench_transport.py measures time.
"""

from __future__ import annotations

import argparse
import asyncio
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
METHODS = {
    # name: (bench_transport function, its argument)
    "raw aiohttp, unstreamed": ("raw_aiohttp", None),
    "raw aiohttp, streamed": ("raw_aiohttp_streamed", None),
    "LLMClient.complete, unstreamed": ("client_calls", False),
    "LLMClient.complete, streamed": ("client_calls", True),
    "llm_query_batch, streamed": ("streamed_batch", True),
}


def child(method: str, calls: int, base_url: str, code: str) -> None:
    """Runs in the measured process: warm-up, then ``calls`` calls, counted."""
    sys.path.insert(0, str(ROOT))
    if code != "-":  # another checkout's rlm_magic, found first
        sys.path.insert(0, str(Path(code).resolve()))
    import benchmarks.bench_transport as bench

    name, argument = METHODS[method]
    run = getattr(bench, name)
    if argument is not None:
        run = run(argument)

    async def measured() -> None:
        await run(base_url, 64, 64)
        await bench.settle()
        print("warm", flush=True)
        sys.stdin.readline()  # the parent turns instrumentation on
        answers = await run(base_url, calls, 64)
        print("done", flush=True)
        sys.stdin.readline()  # ... and off
        bench.check(answers, calls, method)
        await bench.close_loop_clients()

    asyncio.run(measured())


def instructions(method: str, calls: int, base_url: str, code: str | None) -> int:
    """Instructions of ``calls`` calls, counted from after the warm-up to their end
    (instrumentation is off before: start-up and imports run ~4x slower, not ~50x)."""
    with tempfile.TemporaryDirectory() as scratch:
        process = subprocess.Popen(
            [
                "valgrind",
                "--tool=callgrind",
                "--instr-atstart=no",
                f"--callgrind-out-file={scratch}/out",
                sys.executable,
                __file__,
                "--child",
                method,
                str(calls),
                base_url,
                code or "-",
            ],
            cwd=ROOT,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert process.stdin is not None and process.stdout is not None
        for toggle in ("on", "off"):
            line = process.stdout.readline()
            if line.strip() not in ("warm", "done"):
                _, errors = process.communicate(timeout=60)
                raise RuntimeError(f"{method}: {line!r} {errors[-800:]}")
            subprocess.run(
                ["callgrind_control", "-i", toggle, str(process.pid)],
                check=True,
                capture_output=True,
            )
            process.stdin.write("go\n")
            process.stdin.flush()
        _, errors = process.communicate(timeout=900)
    found = re.search(r"Collected : (\d+)", errors)
    if process.returncode or found is None:
        raise RuntimeError(f"{method}: no count from callgrind: {errors[-800:]}")
    return int(found.group(1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", help="an earlier checkout, counted beside this one")
    parser.add_argument("--calls", type=int, default=500)
    parser.add_argument("--methods", help="names of METHODS separated by ';' (all)")
    parser.add_argument("--child", nargs=4, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child[0], int(args.child[1]), args.child[2], args.child[3])
        return
    sys.path.insert(0, str(ROOT))
    from benchmarks.bench_transport import Server

    methods = args.methods.split(";") if args.methods else list(METHODS)
    codes = {"now": None, **({"before": args.before} if args.before else {})}
    server = Server("--latency", "0")
    per_call: dict[tuple[str, str], float] = {}
    try:
        for method in methods:
            for label, code in codes.items():
                count = instructions(method, args.calls, server.base_url, code)
                per_call[(label, method)] = count / args.calls
                print(f"  ... {label} {method}: {count / args.calls:,.0f}", file=sys.stderr)
    finally:
        server.stop()
    print(f"# Instructions per call (callgrind, {args.calls} calls at concurrency 64)\n")
    print("| method | " + " | ".join(f"{label} | x raw" for label in codes) + " |")
    print("|---|" + "---:|---:|" * len(codes))
    for method in methods:
        kind = "unstreamed" if "unstreamed" in method else "streamed"
        cells = []
        for label in codes:
            raw = per_call.get((label, f"raw aiohttp, {kind}"))
            count = per_call[(label, method)]
            cells.append(f"{count / 1e3:,.0f}k | " + (f"{count / raw:.2f}x" if raw else ""))
        print(f"| {method} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
