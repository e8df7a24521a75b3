"""The wasm sandbox (Pyodide in a confined Deno) next to the process sandbox, in one run.

Run from the repo root:  python benchmarks/bench_wasm_vs_process.py [--reps 5]

For each backend (``sandbox.process.launch``, the default launcher, and
``backends.wasm.launch``), the same ``SandboxREPL`` and helpers, reported side by side
with the ratio wasm / process:

- start-up: from ``SandboxREPL.start()`` until the sandbox is ready (a small context
  unpickled), median of ``--reps`` fresh sandboxes;
- per-step overhead: an empty step (``pass``), median of 200;
- one ``llm_query`` round trip from model code (the helper answers at once), median of 100;
- 64 sub-calls from model code against helpers with 20 ms simulated latency, as one
  ``llm_query_batch`` and as a top-level ``asyncio.gather`` of 64 awaited ``llm_query``
  (64 calls over the bridge), the step's wall time, median of ``--reps`` (at least 10);
  target wasm / process <= 1.1x;
- memory per sandbox: the resident size (RSS, and PSS, which shares the pages of shared
  libraries out) of the sandbox's process tree, read from /proc, once it is ready and
  after the batches.

Each time is shown as its median and, in brackets, its fastest: on a shared machine the
fastest is nearer the backend's own cost.

Deno and Pyodide must be present (``pip install 'rlm-magic[wasm]'``, then
``python -m rlm_magic.repl.backends.wasm``); without them only the process column runs.
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

from rlm_magic.repl.backends import wasm  # noqa: E402
from rlm_magic.repl.sandbox import process  # noqa: E402
from rlm_magic.repl.sandbox.repl import SandboxREPL  # noqa: E402

LATENCY_S = 0.020  # a sub-call's simulated latency in the batch measures
BATCH = 64


class Helpers:
    """Helpers served on this loop: answers at once, or after ``latency`` seconds."""

    latency = 0.0

    async def llm_query(self, prompt, **_):
        if self.latency:
            await asyncio.sleep(self.latency)
        return f"echo: {prompt}"

    async def llm_query_batch(self, prompts, **_):
        return list(await asyncio.gather(*(self.llm_query(p) for p in prompts)))

    def table(self):
        return {"llm_query": self.llm_query, "llm_query_batch": self.llm_query_batch}


HELPERS = Helpers()
LAUNCHERS = {"process": process.launch, "wasm": wasm.launch}


async def ready_repl(backend: str, context="small context") -> SandboxREPL:
    repl = SandboxREPL(context, HELPERS.table(), launcher=LAUNCHERS[backend])
    await repl.start()
    await repl._ready()
    return repl


async def start_up(backend: str) -> float:
    started = time.perf_counter()
    repl = await ready_repl(backend)
    elapsed = time.perf_counter() - started
    await repl.aclose()
    return elapsed


async def step_time(repl: SandboxREPL, code: str) -> float:
    started = time.perf_counter()
    output = await repl.run(code, timeout=120)
    elapsed = time.perf_counter() - started
    assert output.error is None, output.error
    return elapsed


class Figure(float):
    """A median, with the fastest beside it: on a shared machine the fastest is nearer
    the backend's own cost, the median what a run meets."""

    fastest: float

    def __new__(cls, times: list[float]) -> Figure:
        figure = super().__new__(cls, statistics.median(times))
        figure.fastest = min(times)
        return figure


async def median_step(repl: SandboxREPL, code: str, steps: int) -> Figure:
    return Figure([await step_time(repl, code) for _ in range(steps)])


def tree(pid: int) -> list[int]:
    """``pid`` and every process under it, from /proc."""
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as stat:
                    parents[int(entry)] = int(stat.read().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                pass
    found, frontier = [pid], [pid]
    while frontier:
        frontier = [child for child, parent in parents.items() if parent in frontier]
        found += frontier
    return found


def _field_kb(path: str, name: str) -> int:
    try:
        with open(path) as lines:
            for line in lines:
                if line.startswith(name):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def memory_mb(repl: SandboxREPL) -> tuple[float, float]:
    """RSS and PSS of the sandbox's process tree, in MB."""
    assert repl._sandbox is not None
    pids = tree(repl._sandbox.process.pid)
    rss = sum(_field_kb(f"/proc/{pid}/status", "VmRSS:") for pid in pids)
    pss = sum(_field_kb(f"/proc/{pid}/smaps_rollup", "Pss:") for pid in pids)
    return rss / 1024, pss / 1024


BATCH_CODE = f"answers = llm_query_batch([f'part {{i}}' for i in range({BATCH})])"
GATHER_CODE = f"answers = await asyncio.gather(*(llm_query(f'part {{i}}') for i in range({BATCH})))"


async def measure(backend: str, reps: int) -> dict[str, float | str]:
    out: dict[str, float | str] = {}
    await start_up(backend)  # page in the interpreter (and Deno, Pyodide) once
    out["start-up"] = Figure([await start_up(backend) for _ in range(reps)])
    repl = await ready_repl(backend)
    try:
        rss, pss = memory_mb(repl)
        out["memory, ready"] = f"{rss:.0f} MB RSS / {pss:.0f} MB PSS"
        await median_step(repl, "pass", 20)  # warm
        out["empty step"] = await median_step(repl, "pass", 200)
        HELPERS.latency = 0.0
        await median_step(repl, "llm_query('a')", 10)
        out["one llm_query round trip"] = await median_step(repl, "llm_query('a')", 100)
        HELPERS.latency = LATENCY_S
        for name, code in (
            (f"llm_query_batch of {BATCH} (20 ms each)", BATCH_CODE),
            (f"gather of {BATCH} llm_query (20 ms each)", GATHER_CODE),
        ):
            await step_time(repl, code)  # warm
            out[name] = await median_step(repl, code, max(reps, 10))
        rss, pss = memory_mb(repl)
        out["memory, after the batches"] = f"{rss:.0f} MB RSS / {pss:.0f} MB PSS"
    finally:
        HELPERS.latency = 0.0
        await repl.aclose()
    return out


def _time(value: float) -> str:
    return f"{value * 1000:.2f} ms" if value < 1 else f"{value:.3f} s"


def _shown(value: float | str | None) -> str:
    if value is None:
        return "-"
    if isinstance(value, Figure):
        return f"{_time(value)} ({_time(value.fastest)})"
    return value if isinstance(value, str) else _time(value)


def _ratio(figure: float | str, other: float | str | None) -> str:
    if not isinstance(figure, Figure) or not isinstance(other, Figure):
        return ""
    return f"{other / figure:.2f}x ({other.fastest / figure.fastest:.2f}x)"


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=5)
    args = parser.parse_args()

    results = {"process": await measure("process", args.reps)}
    why_not = wasm.unavailable()
    if why_not is None:
        results["wasm"] = await measure("wasm", args.reps)
    else:
        print(f"wasm: not measured ({why_not})")
    bounds = {name: "<= 1.1x" for name in results["process"] if name.startswith(("llm_q", "gath"))}

    print("Times: median (fastest); ratios: of the medians (of the fastest).\n")
    print("| measure | process | wasm | wasm / process | target |\n|---|---|---|---|---|")
    for name, figure in results["process"].items():
        other = results.get("wasm", {}).get(name)
        print(
            f"| {name} | {_shown(figure)} | {_shown(other)} | {_ratio(figure, other)} "
            f"| {bounds.get(name, '')} |"
        )
    if "wasm" in results:
        floor = LATENCY_S
        print(
            f"\nThe batches' floor is one sub-call's latency ({floor * 1000:.0f} ms): what is "
            "above it is the bridge and the step."
        )


if __name__ == "__main__":
    asyncio.run(main())
