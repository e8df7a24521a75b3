"""What one call costs the kernel's loop, transport by transport, side by side in one run.

Run from the repo root:  python benchmarks/bench_transport.py [--calls 1000] [--quick]
                                                 [--only floor,cpu,closing,lag,chunk,generation,rlm]

The local OpenAI-compatible server (``tests/support/llm_server.py``) runs in processes of its
own, so its CPU is not counted against the client. Reported:

0. **CPU per call against raw aiohttp, streamed and not** (``floor``): process CPU time /
   calls of raw aiohttp (the floor: a post, its JSON read; streamed, each event's JSON
   read), ``LLMClient.complete`` and ``llm_query_batch``, the methods taking turns run by
   run, with each one's ratio to the raw row of its kind. Run first, while litellm is
   not imported (an OpenAI-compatible endpoint needs none of it).
0b. **A server that closes kept-alive connections** (``closing``): batches of 64 streamed
   prompts against servers that close each connection after every (2nd) answer, or
   when idle, without saying so: retries spent and items lost, ours and litellm's.
1. **Client CPU per call** (``cpu``): 1,000 calls at concurrency 64 against a server that answers
   at once (so the client's CPU is what limits): raw aiohttp (the floor), the OpenAI SDK,
   a bare ``litellm.acompletion`` gather, and ``llm_query_batch`` with the wire transport
   on and off, with and without the progress bar. CPU is this process's
   ``time.process_time``.
2. **Loop lag**: the worst lateness of a 10 ms heartbeat during a 256-prompt batch at
   concurrency 64, answers after 0.3 s.
3. **A streamed chunk**: this process's CPU for one 2,000-token answer, streamed and not.
4. **Streamed against unstreamed at equal generation time**: 16 answers of 300 tokens
   generated at 100 tokens/s; unstreamed, each arrives whole when its last token is made.
5. **A scripted RLM run**: the root chunks a context and fans out one batch of 64
   sub-calls (0.3 s each), then finishes; streamed, sandbox on. Ideal: the two root
   turns' latencies plus one sub-call latency. Floor: the two root turns' latencies
   plus the same 64 streamed sub-calls sent at once by raw aiohttp, measured beside.
   With ``--official-python`` (an interpreter with PyPI's ``rlms``): the official RLM
   library on the same scripted run (``bench_official_rlm.py``), and ours over its time.

``--code DIR`` measures another checkout's rlm_magic; ``--json FILE`` writes the ratios
(``bench_before_after.py`` runs two checkouts side by side, and records its figures).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
if "--code" in sys.argv:  # another checkout's rlm_magic, measured instead (before imports)
    sys.path.insert(0, str(Path(sys.argv[sys.argv.index("--code") + 1]).resolve()))
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import aiohttp  # noqa: E402

import rlm_magic  # noqa: E402
from rlm_magic.jupyter.helpers import NotebookHelpers as helpers  # noqa: E402
from rlm_magic.llm.litellm_loader import import_litellm  # noqa: E402
from rlm_magic.llm.transports import close_loop_clients  # noqa: E402

logging.getLogger("LiteLLM").setLevel(logging.ERROR)
API_KEY = "sk-bench"


class Server:
    """tests/support/llm_server.py in a process of its own."""

    def __init__(self, *args: str):
        self.process = subprocess.Popen(
            [sys.executable, "-m", "tests.support.llm_server", *args],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stdin=subprocess.PIPE,
            text=True,
        )
        self.base_url = self.process.stdout.readline().strip()
        if not self.base_url.startswith("http"):
            raise RuntimeError("the benchmark server did not start")

    def stats(self) -> dict:
        """The server's counters (completed, rejected, connections...)."""
        self.process.stdin.write("stats\n")
        self.process.stdin.flush()
        return json.loads(self.process.stdout.readline())

    def stop(self) -> None:
        self.process.kill()
        self.process.wait(10)


def prompts(n: int) -> list[str]:
    return [f"bench prompt {i}" for i in range(n)]


def check(answers: list, n: int, method: str) -> None:
    assert len(answers) == n, method
    for i, answer in enumerate(answers):
        if answer != f"echo: bench prompt {i}":
            raise RuntimeError(f"{method}: prompt {i} got {answer!r}")


# -- 1. client CPU per call ---------------------------------------------------------------


async def raw_aiohttp(base_url: str, n: int, concurrency: int) -> list:
    semaphore = asyncio.Semaphore(concurrency)
    async with aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=0), headers={"Authorization": f"Bearer {API_KEY}"}
    ) as s:

        async def one(p):
            async with semaphore:
                async with s.post(
                    base_url + "/chat/completions",
                    json={"model": "bench", "messages": [{"role": "user", "content": p}]},
                ) as r:
                    r.raise_for_status()
                    return (await r.json())["choices"][0]["message"]["content"]

        return await asyncio.gather(*(one(p) for p in prompts(n)))


async def openai_sdk(base_url: str, n: int, concurrency: int) -> list:
    import openai

    semaphore = asyncio.Semaphore(concurrency)
    client = openai.AsyncOpenAI(base_url=base_url, api_key=API_KEY, max_retries=0)
    try:

        async def one(p):
            async with semaphore:
                r = await client.chat.completions.create(
                    model="bench", messages=[{"role": "user", "content": p}]
                )
                return r.choices[0].message.content

        return await asyncio.gather(*(one(p) for p in prompts(n)))
    finally:
        await client.close()


async def bare_litellm(base_url: str, n: int, concurrency: int) -> list:
    semaphore = asyncio.Semaphore(concurrency)

    async def one(p):
        async with semaphore:
            r = await import_litellm().acompletion(
                model="openai/bench",
                api_base=base_url,
                api_key=API_KEY,
                max_retries=0,
                messages=[{"role": "user", "content": p}],
            )
            return r.choices[0].message.content

    return await asyncio.gather(*(one(p) for p in prompts(n)))


def batch(wire: bool, progress: bool):
    async def run(base_url: str, n: int, concurrency: int) -> list:
        rlm = rlm_magic.RLM(
            model="openai/bench",
            api_base=base_url,
            api_key=API_KEY,
            max_concurrency=concurrency,
            progress=progress,
            wire_transport=wire,
            max_retries=0,
        )
        return await helpers(rlm).llm_query_batch(prompts(n))

    return run


METHODS = [
    ("raw aiohttp (the floor)", raw_aiohttp),
    ("`AsyncOpenAI`", openai_sdk),
    ("bare `litellm.acompletion` gather", bare_litellm),
    ("`llm_query_batch`, wire transport", batch(True, False)),
    ("`llm_query_batch`, wire transport, progress bar", batch(True, True)),
    ("`llm_query_batch`, litellm (`wire_transport=False`)", batch(False, False)),
    ("`llm_query_batch`, litellm, progress bar", batch(False, True)),
]


async def settle() -> None:
    """Let background tasks a method left (litellm's logging) finish, untimed."""
    for _ in range(50):
        pending = [
            t
            for t in asyncio.all_tasks() - {asyncio.current_task()}
            if not getattr(t.get_coro(), "__qualname__", "").endswith("_worker_loop")
        ]
        if not pending:
            break
        await asyncio.wait(pending, timeout=0.2)
    await asyncio.sleep(0.05)


async def cpu_per_call(base_url: str, calls: int, reps: int) -> list[tuple]:
    rows = []
    for label, method in METHODS:
        await method(base_url, 64, 64)  # warm up: imports, pools
        await settle()
        walls, cpus = [], []
        for _ in range(reps):
            wall, cpu = time.perf_counter(), time.process_time()
            answers = await method(base_url, calls, 64)
            walls.append(time.perf_counter() - wall)
            cpus.append(time.process_time() - cpu)
            check(answers, calls, label)
            await settle()
        wall, cpu = statistics.median(walls), statistics.median(cpus)
        rows.append((label, calls / wall, cpu / calls * 1000))
        print(f"  ... {label}: {calls / wall:,.0f} calls/s", file=sys.stderr, flush=True)
    return rows


# -- 1b. CPU per call against the wire's floor, streamed and not -------------------------


async def raw_aiohttp_streamed(base_url: str, n: int, concurrency: int) -> list:
    """The floor of a streamed call: aiohttp, each event's JSON read and its text kept."""
    semaphore = asyncio.Semaphore(concurrency)
    loads = json.loads
    async with aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=0), headers={"Authorization": f"Bearer {API_KEY}"}
    ) as s:

        async def one(p):
            async with semaphore:
                async with s.post(
                    base_url + "/chat/completions",
                    json={
                        "model": "bench",
                        "messages": [{"role": "user", "content": p}],
                        "stream": True,
                        "stream_options": {"include_usage": True},
                    },
                ) as r:
                    r.raise_for_status()
                    pieces, pending = [], b""
                    async for data in r.content.iter_any():
                        *lines, pending = (pending + data).split(b"\n")
                        for line in lines:
                            if line.startswith(b"data:") and line[5:].strip() != b"[DONE]":
                                choices = loads(line[5:])["choices"]
                                if choices and choices[0]["delta"].get("content"):
                                    pieces.append(choices[0]["delta"]["content"])
                    return "".join(pieces)

        return await asyncio.gather(*(one(p) for p in prompts(n)))


def client_calls(stream: bool):
    """``LLMClient.complete`` for each prompt (the client's pipeline, no map around it)."""

    async def run(base_url: str, n: int, concurrency: int) -> list:
        rlm = rlm_magic.RLM(
            model="openai/bench",
            api_base=base_url,
            api_key=API_KEY,
            max_concurrency=concurrency,
            progress=False,
            max_retries=0,
            stream=stream,
        )
        answers = await asyncio.gather(
            *(
                rlm.client.complete([{"role": "user", "content": p}], stream=True)
                for p in prompts(n)
            )
        )
        return [a.text for a in answers]

    return run


def streamed_batch(stream: bool, resume: bool | None = None):
    """``llm_query_batch`` as a notebook calls it (``resume=None``: on from 100 prompts,
    each answer written to disk as it comes), or with ``resume`` as given."""

    async def run(base_url: str, n: int, concurrency: int) -> list:
        rlm = rlm_magic.RLM(
            model="openai/bench",
            api_base=base_url,
            api_key=API_KEY,
            max_concurrency=concurrency,
            progress=False,
            max_retries=0,
            stream=stream,
        )
        return await helpers(rlm).llm_query_batch(prompts(n), resume=resume)

    return run


FLOOR_METHODS = {
    # (streamed, label): method; each of ours is divided by the raw row of its kind
    (False, "raw aiohttp"): raw_aiohttp,
    (False, "`LLMClient.complete` gather"): client_calls(False),
    (False, "`llm_query_batch`"): streamed_batch(False),
    (False, "`llm_query_batch`, resume off"): streamed_batch(False, resume=False),
    (True, "raw aiohttp"): raw_aiohttp_streamed,
    (True, "`LLMClient.complete` gather"): client_calls(True),
    (True, "`llm_query_batch`"): streamed_batch(True),
    (True, "`llm_query_batch`, resume off"): streamed_batch(True, resume=False),
}


async def cpu_against_floor(base_url: str, calls: int, reps: int) -> dict:
    """Process CPU per call of each method, the methods interleaved run by run (so a
    machine that gets busier midway weighs on all alike): {(streamed, label): [ms...]}."""
    for method in FLOOR_METHODS.values():
        await method(base_url, 64, 64)  # warm up: imports, pools
    await settle()
    figures: dict = {key: [] for key in FLOOR_METHODS}
    rates: dict = {key: [] for key in FLOOR_METHODS}
    for _ in range(reps):
        for key, method in FLOOR_METHODS.items():
            wall, cpu = time.perf_counter(), time.process_time()
            answers = await method(base_url, calls, 64)
            rates[key].append(calls / (time.perf_counter() - wall))
            figures[key].append((time.process_time() - cpu) / calls * 1000)
            check(answers, calls, key[1])
            await settle()
    return {key: (figures[key], rates[key]) for key in FLOOR_METHODS}


def print_floor_table(results: dict) -> None:
    print("| streamed | client | calls/s | CPU per call (ms), each run | median | x raw |")
    print("|---|---|---:|---|---:|---:|")
    for (streamed, label), (cpus, rates) in results.items():
        floor = statistics.median(results[(streamed, "raw aiohttp")][0])
        median = statistics.median(cpus)
        print(
            f"| {'yes' if streamed else 'no'} | {label} | {statistics.median(rates):,.0f} | "
            + ", ".join(f"{c:.3f}" for c in cpus)
            + f" | {median:.3f} | {median / floor:.2f}x |"
        )


def floor_ratios(results: dict) -> dict[str, float]:
    """Each method's median CPU per call over raw aiohttp's of its kind."""
    ratios = {}
    for (streamed, label), (cpus, _) in results.items():
        floor = statistics.median(results[(streamed, "raw aiohttp")][0])
        kind = "streamed" if streamed else "unstreamed"
        ratios[f"{kind} {label.replace('`', '')} / raw"] = statistics.median(cpus) / floor
    return ratios


# -- 1c. a server that closes kept-alive connections ------------------------------------

CLOSING_SERVERS = (
    # (what it does, its arguments)
    ("closes each connection after every 2nd answer", ("--close-every", "2")),
    ("closes each connection after every answer", ("--close-every", "1")),
    ("closes connections idle 0.2 s (batches 0.2 s apart)", ("--keep-alive", "0.2")),
)


async def closing_batch(base_url: str, wire: bool, batch: int) -> tuple[int, int, int]:
    """One batch of 64 streamed prompts at the default concurrency (16): (retries,
    failed items, connection failures seen by the retries)."""
    rlm = rlm_magic.RLM(
        model="openai/closing",
        api_base=base_url,
        api_key=API_KEY,
        progress=False,
        wire_transport=wire,
        stream=True,
    )
    answers = await helpers(rlm).llm_query_batch(
        [f"batch {batch} prompt {i} " + "word " * (i % 8) for i in range(64)],
        return_exceptions=True,
    )
    records = rlm.client.ledger.records
    failed = sum(isinstance(a, BaseException) for a in answers)
    return sum(r.retries for r in records), failed, len(records)


async def closing_server_section(batches: int) -> None:
    print(
        f"\n## A server that closes kept-alive connections: {batches} batches of 64 "
        "streamed prompts at concurrency 16, without a `Connection: close`\n"
    )
    print("| server | client | retries, each batch | failed items | connections opened |")
    print("|---|---|---|---:|---:|")
    for what, server_args in CLOSING_SERVERS:
        idle = float(server_args[1]) if server_args[0] == "--keep-alive" else 0.0
        for wire in (True, False):
            server = Server("--token-delay", "0.002", *server_args)
            try:
                retries, failed = [], 0
                for batch in range(batches):
                    spent, lost, _ = await closing_batch(server.base_url, wire, batch)
                    retries.append(spent)
                    failed += lost
                    if idle:
                        await asyncio.sleep(idle)
                await close_loop_clients()
                opened = server.stats()["connections"]
            finally:
                server.stop()
            print(
                f"| {what} | {'ours (wire)' if wire else 'litellm'} | "
                + ", ".join(map(str, retries))
                + f" | {failed} | {opened} |"
            )


# -- 2. loop lag ----------------------------------------------------------------------------


async def loop_lag(base_url: str, wire: bool, n: int = 256) -> float:
    worst, stop = 0.0, asyncio.Event()

    async def beat():
        nonlocal worst
        while not stop.is_set():
            before = time.perf_counter()
            await asyncio.sleep(0.01)
            worst = max(worst, time.perf_counter() - before - 0.01)

    beater = asyncio.ensure_future(beat())
    await asyncio.sleep(0.05)
    try:
        check(await batch(wire, False)(base_url, n, 64), n, "lag")
    finally:
        stop.set()
        await beater
    await settle()
    return worst * 1000


# -- 3. a streamed chunk ----------------------------------------------------------------


async def chunk_cpu(base_url: str, wire: bool, words: int = 2000) -> tuple[float, float]:
    rlm = rlm_magic.RLM(
        model="openai/cpu", api_base=base_url, api_key=API_KEY, progress=False, wire_transport=wire
    )
    prompt = " ".join(f"w{i}" for i in range(words))  # echoed back, a chunk per word
    seen: list = []
    figures = {}
    for stream in (False, True, False, True):  # the first of each warms up
        before = time.process_time()
        await rlm.client.complete(
            [{"role": "user", "content": prompt}], stream=stream, on_text=seen.append
        )
        figures[stream] = time.process_time() - before
    chunks = len(seen) // 2
    await settle()
    return (figures[True] - figures[False]) / chunks * 1000, figures[False] * 1000


# -- 4. streamed against unstreamed ---------------------------------------------------


async def streamed_vs_plain(base_url: str, wire: bool) -> tuple[float, float]:
    rlm = rlm_magic.RLM(
        model="openai/gen",
        api_base=base_url,
        api_key=API_KEY,
        progress=False,
        wire_transport=wire,
        max_concurrency=16,
    )
    prompt = " ".join(f"t{i}" for i in range(300))
    walls = {}
    for stream in (False, True):
        started = time.perf_counter()
        await asyncio.gather(
            *(
                rlm.client.complete([{"role": "user", "content": f"{i} {prompt}"}], stream=stream)
                for i in range(16)
            )
        )
        walls[stream] = time.perf_counter() - started
    await settle()
    return walls[False], walls[True]


# -- 5. a scripted RLM run ---------------------------------------------------------------


def rlm_context() -> str:
    return "".join(f"line {i}: some log text about service {i % 7}\n" for i in range(4000))


async def raw_fan_out(base_url: str) -> float:
    """The run's one batch by raw aiohttp, streamed: the same 64 prompts at once, each
    stream read to its end; seconds until the last ends (the batch's floor here, server
    and machine included)."""
    context = rlm_context()
    size = len(context) // 64 + 1
    parts = [context[i : i + size] for i in range(0, len(context), size)]
    headers = {"Authorization": f"Bearer {API_KEY}"}
    async with aiohttp.ClientSession() as session:

        async def one(part: str) -> None:
            body = {
                "model": "sub",
                "messages": [{"role": "user", "content": f"Summarise: {part[:200]}"}],
                "stream": True,
            }
            async with session.post(
                f"{base_url}/chat/completions", json=body, headers=headers
            ) as r:
                async for _ in r.content:
                    pass

        started = time.perf_counter()
        await asyncio.gather(*(one(part) for part in parts))
        return time.perf_counter() - started


async def rlm_run(base_url: str, wire: bool, root_s: float, sub_s: float) -> float:
    rlm = rlm_magic.RLM(
        model="openai/root",
        sub_model="openai/sub",
        api_base=base_url,
        api_key=API_KEY,
        progress=False,
        wire_transport=wire,
        max_concurrency=64,
        stream=True,
        sandbox="process",
    )
    started = time.perf_counter()
    result = await rlm.arun("Summarise the log", context=rlm_context())
    wall = time.perf_counter() - started
    assert result.success and result.iterations == 2, (result.error, result.final_answer)
    assert len(result.variables["answers"]) == 64
    return wall


def official_run(args) -> dict:
    """benchmarks/bench_official_rlm.py, by the official library's interpreter."""
    done = subprocess.run(
        [
            args.official_python,
            str(ROOT / "benchmarks" / "bench_official_rlm.py"),
            "--server-python",
            sys.executable,
            f"--root={args.root}",
            f"--sub={args.sub}",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


SECTIONS = ("floor", "cpu", "closing", "lag", "chunk", "generation", "rlm")


async def main(args) -> None:
    reps = 1 if args.quick else args.reps
    wanted = set(args.only.split(",")) if args.only else set(SECTIONS)
    unknown = wanted - set(SECTIONS)
    if unknown:
        raise SystemExit(f"--only: unknown sections {sorted(unknown)}; known: {SECTIONS}")
    fast = Server("--latency", "0")
    slow = Server("--latency", "0.3")
    generating = Server("--tokens-per-second", "100")
    scripted = Server(
        "--rlm-root",
        "root",
        "--model-latency",
        f"root={args.root}",
        "--model-latency",
        f"sub={args.sub}",
    )
    figures: dict[str, float] = {}
    try:
        print("# rlm-magic transports\n")
        print(
            f"{os.cpu_count()} CPUs; the servers run in processes of their own; "
            f"medians of {reps} run(s)\n"
        )
        if "floor" in wanted:
            # First, while litellm is not imported: an OpenAI-compatible endpoint's calls
            # go without it, as in a kernel that needs it for nothing else.
            print(
                f"## CPU per call against raw aiohttp, streamed and not: {args.calls:,} "
                "calls at concurrency 64, answered at once, the methods taking turns run "
                "by run (process CPU time / calls; litellm not imported)\n"
            )
            floor_results = await cpu_against_floor(fast.base_url, args.calls, reps)
            print_floor_table(floor_results)
            figures.update(floor_ratios(floor_results))

        if "cpu" in wanted:
            print(
                f"\n## Client CPU per call: {args.calls:,} calls at concurrency 64, "
                "answered at once\n"
            )
            print("| client | calls/s | client CPU per call (ms) |")
            print("|---|---:|---:|")
            for label, rate, cpu in await cpu_per_call(fast.base_url, args.calls, reps):
                print(f"| {label} | {rate:,.0f} | {cpu:.3f} |")

        if "closing" in wanted:
            await closing_server_section(args.closing_batches)

        if "lag" in wanted:
            print(
                "\n## Loop lag: worst lateness of a 10 ms heartbeat, 256 prompts at "
                "concurrency 64, 0.3 s answers\n"
            )
            print("| transport | worst lag (ms), each run |")
            print("|---|---|")
            for wire in (True, False):
                await loop_lag(slow.base_url, wire, 64)  # warm up
                lags = [await loop_lag(slow.base_url, wire) for _ in range(max(reps, 2))]
                print(
                    f"| {'wire' if wire else 'litellm'} | "
                    + ", ".join(f"{lag:.0f}" for lag in lags)
                    + " |"
                )

        if "chunk" in wanted:
            print("\n## A streamed chunk: loop CPU per chunk of a 2,000-token answer\n")
            print("| transport | CPU per chunk (ms) | the whole answer unstreamed (ms) |")
            print("|---|---:|---:|")
            for wire in (True, False):
                per_chunk, plain = await chunk_cpu(fast.base_url, wire)
                print(f"| {'wire' if wire else 'litellm'} | {per_chunk:.4f} | {plain:.1f} |")

        if "generation" in wanted:
            print("\n## Streamed against unstreamed: 16 answers of 300 tokens at 100 tokens/s\n")
            print("| transport | unstreamed (s) | streamed (s) | streamed / unstreamed |")
            print("|---|---:|---:|---:|")
            for wire in (True, False):
                plain, streamed = await streamed_vs_plain(generating.base_url, wire)
                print(
                    f"| {'wire' if wire else 'litellm'} | {plain:.2f} | {streamed:.2f} | "
                    f"{streamed / plain:.3f}x |"
                )

        if "rlm" in wanted:
            ideal = 2 * args.root + args.sub
            print(
                f"\n## A scripted RLM run: chunk a context, one batch of 64 sub-calls at "
                f"{args.sub:g} s, finish; streamed, sandbox on; root turns {args.root:g} s "
                f"each; ideal {ideal:.2f} s\n"
            )
            # The batch's own floor, measured beside the runs: 64 streams at once take a
            # server and a 2-core machine longer than one stream's latency.
            await raw_fan_out(scripted.base_url)  # warm up
            fan_outs = [await raw_fan_out(scripted.base_url) for _ in range(3)]
            floor = 2 * args.root + min(fan_outs)
            print(
                f"The same 64 streamed sub-calls by raw aiohttp take "
                f"{', '.join(f'{f:.3f}' for f in fan_outs)} s (not {args.sub:g}): the "
                f"run's floor is {floor:.2f} s.\n"
            )
            print("| transport | wall (s), each run | best / ideal | best / floor |")
            print("|---|---|---:|---:|")
            for wire in (True, False):
                await rlm_run(scripted.base_url, wire, args.root, args.sub)  # warm up
                walls = [
                    await rlm_run(scripted.base_url, wire, args.root, args.sub) for _ in range(3)
                ]
                print(
                    f"| {'wire' if wire else 'litellm'} | "
                    + ", ".join(f"{w:.2f}" for w in walls)
                    + f" | {min(walls) / ideal:.3f}x | {min(walls) / floor:.3f}x |"
                )
                figures[f"rlm {'wire' if wire else 'litellm'} / ideal"] = min(walls) / ideal
                figures[f"rlm {'wire' if wire else 'litellm'} / floor"] = min(walls) / floor
                if wire:
                    best_wire = min(walls)
            if args.official_python:
                official = official_run(args)
                figures["rlm wire / official"] = best_wire / min(official["walls"])
                print(
                    f"\nThe official RLM library (rlms {official['rlms']}) on the same "
                    "scripted run (benchmarks/bench_official_rlm.py): "
                    + ", ".join(f"{w:.2f}" for w in official["walls"])
                    + f" s; ours (wire, best) / its best: {figures['rlm wire / official']:.2f}x"
                )
    finally:
        await close_loop_clients()
        for server in (fast, slow, generating, scripted):
            server.stop()
    if args.json:
        Path(args.json).write_text(json.dumps(figures))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=1000)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--root", type=float, default=0.5, help="root turn latency (0.5)")
    parser.add_argument("--sub", type=float, default=0.3, help="sub-call latency (0.3)")
    parser.add_argument("--quick", action="store_true", help="one run per figure")
    parser.add_argument("--only", help=f"comma-separated sections of {','.join(SECTIONS)}")
    parser.add_argument(
        "--closing-batches", type=int, default=3, help="batches against the closing server (3)"
    )
    parser.add_argument("--code", help="a checkout whose rlm_magic is measured instead")
    parser.add_argument(
        "--official-python",
        help="an interpreter with the official RLM library (rlms): its time on the scripted "
        "run beside ours (benchmarks/bench_official_rlm.py)",
    )
    parser.add_argument("--json", help="write the ratios to this file, as JSON")
    asyncio.run(main(parser.parse_args()))
