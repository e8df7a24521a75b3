"""What the evaluation harness (``rlm_magic.eval``) costs on top of the calls it makes.

Run from the repo root:  python benchmarks/bench_eval.py [--quick] [--latency 0.2]

Against the scripted server of ``tests/support/llm_server.py`` in a process of its own (its
sub-model answers "7" after ``--latency`` seconds; its root model plays a two-turn RLM,
64 sub-calls a run), it measures:

1. **Overhead.** ``evaluate()`` end to end (generating the items, scoring, results, a
   JSON line an item) against the same calls made straight through the library (items
   made beforehand; the same prompts, runs and concurrency limits, nothing recorded):
   the difference, as a share of the bare calls' time. Median of ``--reps`` runs each,
   alternating.
2. **Scale.** A 3-method x 4-task x 3-size x 10-item evaluation: how long its plan takes
   (before anything is sent), the whole run, and, after the last answer, the table (text
   and HTML) and the plot (if matplotlib is importable).

RLM runs use ``sandbox="none"`` here (no sandbox processes): what is measured is the
harness, not the sandbox's start.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

from rlm_magic import RLM  # noqa: E402
from rlm_magic.eval import Evaluation  # noqa: E402
from rlm_magic.eval.methods import (  # noqa: E402
    COMBINE_PROMPT,
    DIRECT_PROMPT,
    PART_PROMPT,
    chunk_lines,
)
from rlm_magic.eval.tasks import CHARS_PER_TOKEN  # noqa: E402
from rlm_magic.llm.messages import build_messages  # noqa: E402
from rlm_magic.maps.run_map import MapSpec, run_map  # noqa: E402

ROOT_MODEL, SUB_MODEL = "openai/root", "openai/sub"
SERVER = """
import sys, threading
from tests.support.llm_server import FakeLLMServer, _rlm_root_turn
server = FakeLLMServer().start()
server.latency = {latency}
server.usage = None
def root(body):
    system = body["messages"][0]
    if system["role"] == "system" and "Python REPL" in system["content"]:
        return _rlm_root_turn(body)
    return "7"
server.reply_with("root", root)
server.reply_with("sub", "7")
print(server.base_url, flush=True)
threading.Event().wait()
"""


class ServerProcess:
    """The scripted server in a process of its own, so it takes no GIL from the client."""

    def __init__(self, latency: float):
        self.process = subprocess.Popen(
            [sys.executable, "-c", SERVER.format(latency=latency)],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            text=True,
        )
        self.base_url = (self.process.stdout.readline() if self.process.stdout else "").strip()
        if not self.base_url.startswith("http"):
            raise RuntimeError("the benchmark server did not start")

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(10)


def make_rlm(server: ServerProcess) -> RLM:
    return RLM(
        model=ROOT_MODEL,
        sub_model=SUB_MODEL,
        api_base=server.base_url,
        api_key="sk-bench",
        progress=False,
        sandbox="none",
        max_concurrency=16,
    )


async def bare_calls(rlm: RLM, evaluation: Evaluation, items: dict) -> None:
    """The calls ``evaluation`` makes, made straight: the same prompts, runs and limits."""
    client = rlm.client
    slots = asyncio.Semaphore(evaluation.concurrency)
    rlm_slots = asyncio.Semaphore(min(evaluation.concurrency, 8))

    async def one(unit) -> None:
        item = items[(unit.task.name, unit.size, unit.index)]
        async with slots:
            if unit.method.name == "rlm":
                async with rlm_slots:
                    await rlm.arun(item.question, item.context)
            elif unit.method.name == "direct":
                prompt = DIRECT_PROMPT.format(question=item.question, context=item.context)
                await client.complete(build_messages(prompt, None), model=rlm.model, stream=True)
            else:
                chunks = chunk_lines(item.context, unit.method.chunk_tokens * CHARS_PER_TOKEN)
                prompts = [
                    PART_PROMPT.format(question=item.question, number=n, parts=len(chunks), chunk=c)
                    for n, c in enumerate(chunks, 1)
                ]
                answers, _ = await run_map(
                    client, [build_messages(p, None) for p in prompts], MapSpec()
                )
                listed = "\n".join(f"Part {n}: {a}" for n, a in enumerate(answers, 1))
                combine = COMBINE_PROMPT.format(
                    question=item.question, parts=len(chunks), answers=listed
                )
                await client.complete(build_messages(combine, None), model=rlm.model, stream=True)

    await asyncio.gather(*(one(unit) for unit in evaluation.units))


async def overhead(server: ServerProcess, reps: int, n: int, sizes: str) -> None:
    rlm = make_rlm(server)
    options = dict(tasks="niah,count,pairs,two_hop", sizes=sizes, n=n, methods="rlm,direct,map")
    # Warm up: imports, connections, the price map.
    await Evaluation(rlm, "niah", ["2k"], 1, "rlm,direct,map").run()
    harness, bare = [], []
    with tempfile.TemporaryDirectory() as scratch:
        for rep in range(reps):
            evaluation = Evaluation(rlm, **options, jsonl=Path(scratch) / f"{rep}.jsonl")
            started = time.perf_counter()
            results = await evaluation.run()
            harness.append(time.perf_counter() - started)
            assert len(results) == len(evaluation.units), results.stopped
            assert not any(i.error for i in results.items), [i.error for i in results.items]

            evaluation = Evaluation(rlm, **options)
            items = {
                (u.task.name, u.size, u.index): u.task.make(u.size, u.index, 0)
                for u in evaluation.units
            }
            started = time.perf_counter()
            await bare_calls(rlm, evaluation, items)
            bare.append(time.perf_counter() - started)
    h, b = statistics.median(harness), statistics.median(bare)
    units = len(evaluation.units)
    print(f"Overhead: {units} items ({options['methods']} x {options['tasks']} x {sizes} x {n})")
    print(f"  evaluate():  {h:.2f} s  (runs: {', '.join(f'{t:.2f}' for t in harness)})")
    print(f"  bare calls:  {b:.2f} s  (runs: {', '.join(f'{t:.2f}' for t in bare)})")
    print(f"  harness adds {h - b:+.2f} s = {(h - b) / b:+.1%} of the bare calls' time")


async def scale(server: ServerProcess, sizes: str) -> None:
    rlm = make_rlm(server)
    started = time.perf_counter()
    evaluation = Evaluation(
        rlm, "niah,count,pairs,two_hop", sizes, 10, "rlm,direct,map", max_cost_usd=None
    )
    plan_s = time.perf_counter() - started
    print(f"\nScale: 3 methods x 4 tasks x 3 sizes ({sizes}) x 10 items")
    print(f"  plan: {plan_s * 1000:.0f} ms before anything is sent: {evaluation.plan.summary()}")
    started = time.perf_counter()
    results = await evaluation.run()
    run_s = time.perf_counter() - started
    after = time.perf_counter()
    text = repr(results)
    html = results._repr_html_()
    table_s = time.perf_counter() - after
    after = time.perf_counter()
    png = results.plot_png()
    plot_s = time.perf_counter() - after
    print(f"  run: {run_s:.1f} s, {len(results)} items, {rlm.usage().calls} calls")
    print(
        f"  after the last answer: table {table_s * 1000:.0f} ms (text {len(text):,} "
        f"characters, HTML {len(html):,}); plot "
        + (f"{plot_s * 1000:.0f} ms ({len(png):,} bytes PNG)" if png else "skipped (no matplotlib)")
    )
    print(f"  table + plot: {(table_s + plot_s):.2f} s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--latency", type=float, default=0.2)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="fewer items, one rep")
    args = parser.parse_args()
    server = ServerProcess(args.latency)
    try:
        n = 2 if args.quick else 5
        reps = 1 if args.quick else args.reps
        asyncio.run(overhead(server, reps, n, "8k,32k"))
        asyncio.run(scale(server, "4k,16k,64k" if args.quick else "8k,32k,128k"))
    finally:
        server.stop()


if __name__ == "__main__":
    main()
