"""What the sandboxed REPL costs next to the in-process one.

Run from the repo root:  python benchmarks/bench_sandbox.py [--reps 5]

- run start-up: from ``SandboxREPL.start()`` until the sandbox is ready (process
  spawned, every isolation layer applied, a small context unpickled), and the same
  with isolation off, side by side;
- per-step overhead: a trivial step (``x = 1``) in each REPL, median of many;
- a 64-item ``llm_query_batch`` from the model's code: the step's wall time in each REPL,
  against the local test server (tests/support/llm_server.py) with 0.3 s sub-call latency;
- a 100 MB string context: start-up with it, minus start-up with a small one;
- stopping a step: a sleeping step (SIGINT) and one that ignores SIGINT (SIGKILL after
  the grace period), from the cancel to ``run()`` returning;
- whatever the sandbox sends: the kernel's peak memory growth (VmHWM, reset before each)
  and its loop's longest stall (a 5 ms heartbeat) while model code sends hostile or
  maximal frames, and while a scripted root model's hostile blocks run through
  ``RLM.arun`` (schemas that cost exponential time, errors that would quote megabytes
  per prompt, replies left unread, answers too costly to check, a 1 MB list answer),
  with the time from an interrupt to ``arun`` returning during each.
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
from tests.support.llm_server import FakeLLMServer  # noqa: E402


async def _echo(prompt, **_):
    return f"echo: {prompt}"


HELPERS = {"llm_query": _echo}


async def start_up(context, isolate: bool = True) -> float:
    repl = SandboxREPL(context, HELPERS)
    repl.isolate = isolate
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
    rlm = RLM(
        model="openai/root",
        sub_model="openai/sub",
        api_base=server.base_url,
        api_key="sk-bench",
        progress=False,
        max_concurrency=n,
        sandbox=sandbox,
    )
    server.script(
        "root",
        [
            f"```repl\nanswers = llm_query_batch([f'part {{i}}' for i in range({n})])\n```",
            "FINAL_VAR(answers)",
        ],
    )
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
    parser.add_argument(
        "--hostile", action="store_true", help="only what hostile model code costs the kernel"
    )
    args = parser.parse_args()
    reps = args.reps

    print("| measure | median (min-max) | bound |\n|---|---|---|")
    if args.hostile:
        await hostile_runs()
        return
    await start_up("warm")  # page in the interpreter and its modules once
    ups, bare = [], []
    for _ in range(reps):
        ups.append(await start_up("small context"))
        bare.append(await start_up("small context", isolate=False))
    row("run start-up, isolated", _span(ups), "<= 100 ms")
    row("run start-up, isolation off", _span(bare), "")

    sandboxed = SandboxREPL("c", HELPERS)
    await sandboxed.start()
    in_process = AsyncREPL({"__builtins__": repl_builtins()}, HELPERS)
    for name, code in (
        ("trivial step", "x = 1"),
        ("step with one llm_query and 20 kB printed", "print(llm_query('a') * 2000)"),
    ):
        remote = await step_cost(sandboxed, code)
        local = await step_cost(in_process, code)
        row(f"{name}: sandbox / in-process", f"{remote * 1000:.2f} ms / {local * 1000:.2f} ms", "")
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
        row(
            "64-item batch, sandbox / in-process",
            f"{statistics.median(ratios):.3f}x ({min(ratios):.3f}-{max(ratios):.3f})",
            "<= 1.05x",
        )
    finally:
        server.stop()

    sigint = [await stop_time("time.sleep(30)") for _ in range(reps)]
    row("interrupt -> step stopped (SIGINT)", _span(sigint), "<= 1 s")
    killed = [
        await stop_time("signal.signal(signal.SIGINT, signal.SIG_IGN)\nwhile True:\n    pass")
        for _ in range(reps)
    ]
    row("interrupt -> step stopped (ignores SIGINT: SIGKILL)", _span(killed), "<= 1 s")

    for name, code in HOSTILE.items():
        growth, stall = await hostile(code)
        row(
            f"sandbox sends {name}: kernel memory growth / longest loop stall",
            f"{growth:.1f} MB / {stall * 1000:.0f} ms",
            "<= 64 MB / <= 100 ms",
        )
    await hostile_runs()


async def hostile_runs() -> None:
    await hostile_run("FINAL(warm)", None)  # imports litellm once
    for name, (code, answer) in HOSTILE_RUNS.items():
        growth, stall, _ = await hostile_run(code, answer)
        _, _, interrupt = await hostile_run(code, answer, interrupt_after=0.3)
        row(
            f"model code {name}: kernel memory growth / longest loop stall / interrupt",
            f"{growth:.1f} MB / {stall * 1000:.0f} ms / {interrupt * 1000:.0f} ms",
            "<= 64 MB / <= 100 ms / <= 1 s",
        )


_DOUBLING = """
defs = {"a0": {"type": "string"}}
for i in range(1, 19):
    defs[f"a{i}"] = {"allOf": [{"$ref": f"#/$defs/a{i-1}"}, {"$ref": f"#/$defs/a{i-1}"}]}
print(llm_query("q", response_format={"$defs": defs, "$ref": "#/$defs/a18"}))
"""
_UNREAD = """
import gc, json, os, struct, sys, time
worker = next(o for o in gc.get_objects() if type(o).__name__ == "Worker")
worker.calls_lock.acquire()
for i in range(400):
    body = json.dumps({"op": "call", "id": 10_000 + i, "step": worker.current_step,
                       "name": "llm_query", "args": [f"p{i}"], "kwargs": {}}).encode()
    os.write(int(sys.argv[1]), struct.pack(">cQ", b"J", len(body)) + body)
time.sleep(30)
"""
# name: (the block, what the sub-model answers)
HOSTILE_RUNS = {
    "asks with a 1.3 KB schema whose $refs double 18 times": (_DOUBLING, '"x"'),
    "asks with a 460 KB schema of 24,000 alternatives": (
        "print(llm_query('q', response_format={'anyOf': "
        "[{'const': f'v{i}'} for i in range(24_000)]}))",
        '"x"',
    ),
    "asks a 400-prompt batch with a 99 KB invalid schema": (
        "print(llm_query_batch(['p'] * 400, response_format={'type': ['x' * 99_000]})[0][:60])",
        '"x"',
    ),
    "gets an answer that takes 500,000 checks": (
        "print(llm_query('q', response_format={'type': 'array', "
        "'items': {'anyOf': [{'const': i} for i in range(100)]}}))",
        "[" + ",".join(["99"] * 5_000) + "]",
    ),
    "leaves 400 replies of 256 KB unread": (_UNREAD, "y" * 2**18),
    "answers FINAL with a 1 MB list": ('FINAL("[" + "0," * 499_998 + "0]")', None),
}


def _serve(code: str, answer: str | None, address) -> None:
    """The test server in a process of its own: its work is not the kernel's."""
    server = FakeLLMServer().start()
    server.script("root", [f"```repl\n{code}\n```", "FINAL(done)"])
    if answer is not None:
        server.reply_with("sub", lambda body: answer)
    address.send(server.base_url)
    address.recv()  # until the run is over
    server.stop()


async def hostile_run(
    code: str, answer: str | None, interrupt_after: float | None = None
) -> tuple[float, float, float]:
    """Peak growth of this process's memory (MB), the loop's longest stall (s) while a
    scripted root model's block runs through ``RLM.arun``, and with ``interrupt_after``
    the time from cancelling the run to its end (s)."""
    import multiprocessing

    here, there = multiprocessing.Pipe()
    server = multiprocessing.get_context("spawn").Process(
        target=_serve, args=(code, answer, there), daemon=True
    )
    server.start()
    base_url = await asyncio.to_thread(here.recv)
    rlm = RLM(
        model="openai/root",
        sub_model="openai/sub",
        api_base=base_url,
        api_key="sk-bench",
        progress=False,
        step_timeout=20,
        timeout=20,
    )
    stopped = 0.0
    async with Watched() as watched:
        run = asyncio.ensure_future(rlm.arun("q", context="c"))
        if interrupt_after is not None:
            await asyncio.sleep(interrupt_after)
            cancelled = time.perf_counter()
            run.cancel()
        try:
            await run
        except asyncio.CancelledError:
            pass
        if interrupt_after is not None:
            stopped = time.perf_counter() - cancelled
    here.send("done")
    await asyncio.to_thread(server.join, 10)
    return watched.growth_mb, watched.longest_stall, stopped


class Watched:
    """This process's peak memory growth (MB, from VmHWM, reset on entry) and its
    loop's longest stall (s, a 5 ms heartbeat) while the block runs."""

    async def __aenter__(self) -> Watched:
        self.stalls: list[float] = []
        with open("/proc/self/clear_refs", "w") as refs:
            refs.write("5")  # resets VmHWM, the peak resident size
        self.before = _resident_mb()
        self.beat = asyncio.ensure_future(self._heartbeat())
        return self

    async def _heartbeat(self) -> None:
        while True:
            started = time.perf_counter()
            await asyncio.sleep(0.005)
            self.stalls.append(time.perf_counter() - started - 0.005)

    async def __aexit__(self, *exc) -> None:
        self.beat.cancel()
        self.growth_mb = _peak_mb() - self.before
        self.longest_stall = max(self.stalls, default=0.0)


_RAW = (
    "import os, sys, struct, time\nbody = {body}\n"
    "os.write(int(sys.argv[1]), struct.pack('>cQ', b'J', len(body)) + body)\n"
    "time.sleep(3)"
)
HOSTILE = {
    "llm_query_batch([''] * 10_000_000)": (
        "try:\n    llm_query_batch([''] * 10_000_000)\nexcept ValueError:\n    pass"
    ),
    "an 8 MB frame of empty objects": _RAW.format(
        body="b'{\"op\": \"call\", \"args\": [' + b'{},' * 2_700_000 + b'{}]}'"
    ),
    # Accepted, and as costly to decode as a frame may be: 98,000 values, and a text
    # that one escaped emoji makes 4 bytes a character once decoded.
    "an 8 MB frame at the limits (98,000 values, 7.5 MB of 4-byte text)": _RAW.format(
        body='b\'{"op": "x", "a": [\' + b\'{},\' * 48_999 + b\'{}], "t": "\' '
        "+ b'a' * 7_500_000 + bytes([92]) + b'ud83d' + bytes([92]) + b'ude00\"}'"
    ),
    "an 8 MB FINAL_VAR text (the largest answer)": "x = 'a' * 8_000_000\nFINAL_TEXT = x",
    "six 16 MB variables (result.variables)": "\n".join(f"v{i} = 'x' * 2**24" for i in range(6)),
}


async def hostile(code: str) -> tuple[float, float]:
    """Peak growth of this process's memory (MB) and the loop's longest stall (s)
    while a sandbox runs ``code`` and its variables and FINAL_VAR are read."""
    repl = SandboxREPL("c", HELPERS)
    await repl.start()
    await repl.run("pass")
    async with Watched() as watched:
        await repl.run(code)
        await repl.final_var("x")
        await repl.variables()
    await repl.aclose()
    return watched.growth_mb, watched.longest_stall


def _status(field: str) -> float:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field):
                return int(line.split()[1]) / 1024
    return 0.0


def _resident_mb() -> float:
    return _status("VmRSS:")


def _peak_mb() -> float:
    return _status("VmHWM:")


def _span(values: list[float]) -> str:
    return (
        f"{statistics.median(values) * 1000:.1f} ms "
        f"({min(values) * 1000:.1f}-{max(values) * 1000:.1f})"
    )


if __name__ == "__main__":
    asyncio.run(main())
