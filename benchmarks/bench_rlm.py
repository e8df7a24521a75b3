"""A two-iteration RLM run with a 32-prompt batch costs two root latencies plus one sub
latency, not 32.

Run from the repo root:  python benchmarks/bench_rlm.py [--root 0.5] [--sub 0.5] [--n 32]

The root model (scripted by the local server of tests/support/llm_server.py) replies once with
code that fans out ``llm_query_batch`` over N prompts, then with FINAL_VAR. The same run
is timed three ways: model code calling the batch without ``await``, with ``await``, and
(for contrast) a loop of single ``llm_query`` calls, which is what a blocking REPL does.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

from rlm_magic import RLM  # noqa: E402
from tests.support.llm_server import FakeLLMServer  # noqa: E402

STYLES = {
    "batch, no await": "answers = llm_query_batch([f'part {{i}}' for i in range({n})])",
    "batch, await": "answers = await llm_query_batch([f'part {{i}}' for i in range({n})])",
    "loop of llm_query (sequential)": "answers = [llm_query(f'part {{i}}') for i in range({n})]",
}


async def one_run(server: FakeLLMServer, code: str) -> float:
    rlm = RLM(
        model="openai/root",
        sub_model="openai/sub",
        api_base=server.base_url,
        api_key="sk-bench",
        progress=False,
        max_concurrency=64,
    )
    server.script("root", [f"```repl\n{code}\n```", "FINAL_VAR(answers)"])
    started = time.perf_counter()
    result = await rlm.arun("bench", context="x")
    elapsed = time.perf_counter() - started
    assert result.success and result.iterations == 2, result
    return elapsed


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=float, default=0.5, help="root latency, s (0.5)")
    parser.add_argument("--sub", type=float, default=0.5, help="sub latency, s (0.5)")
    parser.add_argument("--n", type=int, default=32, help="prompts in the batch (32)")
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args()

    server = FakeLLMServer().start()
    server.model_latency = {"root": args.root, "sub": args.sub}
    try:
        await one_run(server, STYLES["batch, await"].format(n=2))  # warm-up (imports)
        ideal = 2 * args.root + args.sub
        print(f"# Two-iteration RLM run, {args.n}-prompt batch\n")
        print(
            f"root latency {args.root:g} s, sub latency {args.sub:g} s; ideal = 2 x root "
            f"+ 1 x sub = {ideal:.2f} s; sequential = 2 x root + {args.n} x sub = "
            f"{2 * args.root + args.n * args.sub:.2f} s; median of {args.reps}\n"
        )
        print("| model code | wall (s) | / ideal | peak requests in flight |")
        print("|---|---:|---:|---:|")
        for label, template in STYLES.items():
            times, peaks = [], []
            reps = 1 if "sequential" in label else args.reps
            for _ in range(reps):
                server.reset()
                server.model_latency = {"root": args.root, "sub": args.sub}
                times.append(await one_run(server, template.format(n=args.n)))
                peaks.append(server.peak_in_flight)
            wall = statistics.median(times)
            print(f"| {label} | {wall:.2f} | {wall / ideal:.2f}x | {max(peaks)} |")
    finally:
        server.stop()


if __name__ == "__main__":
    asyncio.run(main())
