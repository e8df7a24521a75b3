"""What model-sent data costs the kernel: each reader alone, and whole runs (issue 38).

Run from the repo root:  python benchmarks/bench_model_sent.py [--runs-only | --readers-only]
(it measures the rlm_magic of the tree it is in: copy it into another commit's tree, with
bench_sandbox.py, for that commit's figures side by side).

- each reader of model-sent data, alone, on the payload that costs it most that we know
  of: its CPU time per MB (this thread's clock) and its peak allocation (tracemalloc);
- whole runs: a scripted root model's block sends the payload through ``RLM.arun`` and
  the sandbox, against the local test server in a process of its own: the kernel's
  peak memory growth (VmHWM), its loop's longest stall (a 5 ms heartbeat) and its CPU
  time per call (``time.process_time``: the server and the sandbox are other processes).

Targets: a loop stall of at most 100 ms and at most +64 MB for any payload within the
bridge's limits; schema validation within 1 s of the kernel's CPU per call.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
import tracemalloc
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

from bench_sandbox import hostile_run, row  # noqa: E402

from rlm_magic.llm import structured  # noqa: E402
from rlm_magic.repl import bridge  # noqa: E402
from rlm_magic.rlm import replies  # noqa: E402
from rlm_magic.rlm.finishing import is_error  # noqa: E402


def _frame_body(message: dict) -> bytes:
    return bridge.frame(message)[bridge.HEADER.size :]


def _read_frame(body: bytes) -> dict:
    bridge.check_body(body)
    return bridge.parse_json(body)


def _typed(schema: dict):
    fmt = structured.AnswerFormat(schema, trusted=False)
    return lambda text: fmt.parse(text)


_OBJECTS = json.dumps([{"id": i, "tags": [i, str(i)]} for i in range(3_000)])
# name: (reader, payload)
READERS = {
    "printed marker, 3.4 MB of 'a) '": (replies.read_printed_final, "FINAL(" + "a) " * 1_133_000),
    "printed marker, 3.4 MB of '('": (replies.read_printed_final, "FINAL(" + "(" * 3_400_000),
    "printed marker, 3.4 MB of lines": (replies.read_printed_final, "FINAL(" + "x\n" * 1_700_000),
    "printed marker, 3.4 MB of '\"' lines": (
        replies.read_printed_final,
        "FINAL(" + '"\n' * 1_700_000,
    ),
    "reply, a line of 24 '*' (exponential before)": (replies.read_reply, "*" * 24 + "x"),
    "reply, 1 MB of markers and list items": (
        replies.read_reply,
        ("FINAL(a) " + "b) " * 30 + "\n") * 10_000,
    ),
    "typed answer, uniqueItems over 3,000 objects": (
        _typed({"type": "array", "uniqueItems": True}),
        _OBJECTS,
    ),
    "typed answer, anyOf of 600 types against 1 MB": (
        _typed({"anyOf": [{"type": "string"}] * 600}),
        json.dumps([["x" * 100] * 100] * 100),
    ),
    "typed answer, fenced, 2,000 blank lines": (
        _typed({"type": "object"}),
        "```\n" + "\n" * 2_000 + "x",
    ),
    "frame, 8 MB of text": (_read_frame, _frame_body({"op": "x", "v": "a" * 8_000_000})),
    "frame, 49,000 floats": (_read_frame, _frame_body({"op": "x", "v": [1.2345e300] * 49_000})),
    "is_error, 1 MB list of error strings": (is_error, "[" + "'Error: x', " * 83_000 + "]"),
}


def _attempt(read, payload) -> float:
    """The CPU time ``read(payload)`` takes this thread, whether it reads or refuses."""
    started = time.thread_time()
    try:
        read(payload)
    except Exception:  # noqa: BLE001 - refusing is an outcome too
        pass
    return time.thread_time() - started


def readers() -> None:
    for name, (read, payload) in READERS.items():
        seconds = min(_attempt(read, payload) for _ in range(3))
        tracemalloc.start()  # a second pass: tracemalloc slows Python code down
        _attempt(read, payload)
        peak = tracemalloc.get_traced_memory()[1] / 2**20
        tracemalloc.stop()
        size = len(payload) / 2**20
        row(
            f"{name}: CPU (per MB) / peak allocation",
            f"{seconds * 1000:.0f} ms ({seconds * 1000 / max(size, 1e-3):.0f} ms/MB) / "
            f"{peak:.1f} MB",
            "linear; <= 100 ms / <= 64 MB",
        )


_FOUR_UNIQUE = "\n".join(
    ["schema = {'type': 'array', 'uniqueItems': True}"]
    + ["print(str(llm_query('q', response_format=schema))[:40])"] * 4
)
# name: (the block, what the sub-model answers, how many calls it makes)
RUNS = {
    # An f-string that starts with FINAL( is a printed finish (a "+" is not).
    "prints a 3.4 MB FINAL( of 'a) '": ("print(f\"FINAL({'a) ' * 1_133_000}\")", None, 0),
    "prints a 3.4 MB FINAL( of '('": ("print(f\"FINAL({'(' * 3_400_000}\")", None, 0),
    "asks uniqueItems over 3,000 objects, four times": (_FOUR_UNIQUE, _OBJECTS, 4),
    "asks anyOf of 600 types of a 1 MB answer": (
        "print(str(llm_query('q', response_format={'anyOf': [{'type': 'string'}] * 600}))[:60])",
        json.dumps([["x" * 100] * 100] * 100),
        1,
    ),
    "asks for an object, gets 2,000 blank lines in a fence": (
        "print(llm_query('q', response_format={'type': 'object'})[:60])",
        "```\n" + "\n" * 2_000 + "x",
        1,
    ),
}


async def runs(only: str) -> None:
    # A typed call imports litellm (about 150 MB and a second): once, before measuring.
    await hostile_run("print(llm_query('q', response_format={'type': 'string'}))", '"x"')
    started = time.process_time()
    await hostile_run("print(1)", None)
    bare = time.process_time() - started  # a run's own CPU, taken off each below
    for name, (code, answer, calls) in RUNS.items():
        if only not in name:
            continue
        started = time.process_time()
        growth, stall, _ = await hostile_run(code, answer)
        cpu = time.process_time() - started - bare
        per_call = f" / {cpu / calls:.2f} s CPU per call" if calls else ""
        row(
            f"model code {name}: kernel memory growth / longest loop stall"
            + (" / CPU per call" if calls else ""),
            f"{growth:.1f} MB / {stall * 1000:.0f} ms{per_call}",
            "<= 64 MB / <= 100 ms" + (" / <= 1 s" if calls else ""),
        )


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs-only", action="store_true")
    parser.add_argument("--readers-only", action="store_true")
    parser.add_argument("--only", default="", help="only the runs whose name holds this")
    args = parser.parse_args()
    print("| measure | figure | bound |\n|---|---|---|")
    if not args.runs_only:
        readers()
    if not args.readers_only:
        await runs(args.only)


if __name__ == "__main__":
    asyncio.run(main())
