"""What the sandboxed REPL costs next to the in-process one.

Run from the repo root:  python benchmarks/bench_sandbox.py [--reps 5]

- run start-up: from ``SandboxREPL.start()`` until the sandbox is ready (process
  spawned, network namespace and memory cap set, a small context unpickled);
- per-step overhead: a trivial step (``x = 1``) in each REPL, median of many;
- a 64-item ``llm_query_batch`` from the model's code: the step's wall time in each REPL,
  against the local test server (tests/llm_server.py) with 0.3 s sub-call latency;
- a 100 MB string context: start-up with it, minus start-up with a small one;
- stopping a step: a sleeping step (SIGINT) and one that ignores SIGINT (SIGKILL after
  the grace period), from the cancel to ``run()`` returning.
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
from rlm_magic.repl.inprocess import AsyncREPL  # noqa: E402
from rlm_magic.repl.sandbox import SandboxREPL  # noqa: E402
from rlm_magic.repl.steps import repl_builtins  # noqa: E402
from tests.llm_server import FakeLLMServer  # noqa: E402


async def _echo(prompt, **_):
    return f"echo: {prompt}"


HELPERS = {"llm_query": _echo}


async def start_up(context) -> float:
    repl = SandboxREPL(context, HELPERS)
    started = time.perf_counter()
    await repl.start()
    await repl._ready()
    elapsed = time.perf_counter() - started
    await repl.aclose()
    return elapsed


async def step_cost(repl, code: str, steps: int = 300) -> float:
    times = []
    for _ in range(steps):
        started = time.perf_counter()
        output = await repl.run(code)
        times.append(time.perf_counter() - started)
        assert output.error is None, output.error
    return statistics.median(times)


async def batch_step(server, sandbox: str, n: int = 64) -> float:
    rlm = RLM(model="openai/root", sub_model="openai/sub", api_base=server.base_url,
              api_key="sk-bench", progress=False, max_concurrency=n, sandbox=sandbox)
    server.script("root", [f"```repl\nanswers = llm_query_batch([f'part {{i}}' for i in "
                           f"range({n})])\n```", "FINAL_VAR(answers)"])
    result = await rlm.arun("bench", context="x")
    assert result.success, result
    return result.trajectory[0].code[0].elapsed_s


async def stop_time(code: str) -> float:
    repl = SandboxREPL("c", HELPERS)
    await repl.start()
    await repl.run("import signal, time")
    task = asyncio.ensure_future(repl.run(code))
    await asyncio.sleep(0.3)
    cancelled = time.perf_counter()
    task.cancel()
    try:
        await task
    except asyncio.CancelledError:
        pass
    elapsed = time.perf_counter() - cancelled
    await repl.aclose()
    return elapsed


def row(name: str, figure: str, bound: str) -> None:
    print(f"| {name} | {figure} | {bound} |")


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=5)
    args = parser.parse_args()
    reps = args.reps

    print("| measure | median (min-max) | bound |\n|---|---|---|")
    await start_up("warm")  # page in the interpreter and its modules once
    ups = [await start_up("small context") for _ in range(reps)]
    row("run start-up", _span(ups), "<= 0.3 s")

    sandboxed = SandboxREPL("c", HELPERS)
    await sandboxed.start()
    in_process = AsyncREPL({"__builtins__": repl_builtins()}, HELPERS)
    for name, code in (("trivial step", "x = 1"),
                       ("step with one llm_query and 20 kB printed",
                        "print(llm_query('a') * 2000)")):
        remote = await step_cost(sandboxed, code)
        local = await step_cost(in_process, code)
        row(f"{name}: sandbox / in-process",
            f"{remote * 1000:.2f} ms / {local * 1000:.2f} ms", "")
        row(f"{name}: per-step overhead", f"{(remote - local) * 1000:.2f} ms", "<= 20 ms")
    await sandboxed.aclose()
    in_process.close()

    big = "y" * 100_000_000
    transfers = []
    for _ in range(reps):
        transfers.append(await start_up(big) - await start_up("small"))
    row("100 MB string context (extra start-up)", _span(transfers), "<= 1 s")

    server = FakeLLMServer().start()
    server.model_latency = {"sub": 0.3}
    try:
        await batch_step(server, "none", 4)  # warm-up: imports litellm
        ratios, boxed, plain = [], [], []
        for _ in range(reps):
            plain.append(await batch_step(server, "none"))
            boxed.append(await batch_step(server, "process"))
            ratios.append(boxed[-1] / plain[-1])
        row("64-item batch step, in-process", _span(plain), "")
        row("64-item batch step, sandbox", _span(boxed), "")
        row("64-item batch, sandbox / in-process", f"{statistics.median(ratios):.3f}x "
            f"({min(ratios):.3f}-{max(ratios):.3f})", "<= 1.15x")
    finally:
        server.stop()

    sigint = [await stop_time("time.sleep(30)") for _ in range(reps)]
    row("interrupt -> step stopped (SIGINT)", _span(sigint), "<= 1 s")
    killed = [await stop_time("signal.signal(signal.SIGINT, signal.SIG_IGN)\n"
                              "while True:\n    pass") for _ in range(reps)]
    row("interrupt -> step stopped (ignores SIGINT: SIGKILL)", _span(killed), "<= 1 s")


def _span(values: list[float]) -> str:
    return (f"{statistics.median(values) * 1000:.1f} ms "
            f"({min(values) * 1000:.1f}-{max(values) * 1000:.1f})")


if __name__ == "__main__":
    asyncio.run(main())
