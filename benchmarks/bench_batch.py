"""How fast ``llm_query_batch`` runs N prompts, against the other ways of doing it.

Run from the repo root:  python benchmarks/bench_batch.py [--quick] [--latency 0.3]

Every method sends N chat requests (model "openai/bench") to the local fake
OpenAI-compatible server of ``tests/support/llm_server.py``, in its own process (it answers
after ``--latency`` seconds), and the wall time of the whole batch is measured. Each
method is warmed up once first (imports, connection pools), then each cell is the median
of --reps runs.
All async methods share one event loop, as in a notebook kernel. At the end, a 10 ms
heartbeat task on that loop measures how long the loop stalls during N=256 batches at
concurrency 64 (bare litellm gather vs llm_query_batch).
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.metadata
import logging
import os
import platform
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import aiohttp  # noqa: E402
import openai  # noqa: E402

import rlm_magic  # noqa: E402
from rlm_magic.jupyter.helpers import NotebookHelpers as helpers  # noqa: E402
from rlm_magic.llm.litellm_loader import import_litellm  # noqa: E402

# The same import path as rlm_magic's (it also freezes litellm's objects out of the
# cyclic GC's way), so every method below runs in the same process state.
litellm = import_litellm()

litellm.suppress_debug_info = True
logging.getLogger("LiteLLM").setLevel(logging.ERROR)

MODEL = "openai/bench"
API_KEY = "sk-bench"
SEQUENTIAL_MAX_N = 16
THREADS = 8
HEARTBEAT_N = 256
HEARTBEAT_CONCURRENCY = 64
# A cell whose first run takes longer than this is not repeated (keeps the run short).
SLOW_CELL_S = 8.0


class ServerProcess:
    """tests/support/llm_server.py in a process of its own: in a thread of this process its
    request handling would compete with the client for the GIL and skew the timings."""

    def __init__(self, latency: float):
        import subprocess

        self.latency = latency
        self.process = subprocess.Popen(
            [sys.executable, "-m", "tests.support.llm_server", "--latency", str(latency)],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            text=True,
        )
        self.base_url = self.process.stdout.readline().strip()
        if not self.base_url.startswith("http"):
            raise RuntimeError("the benchmark server did not start")

    def reset(self) -> None:
        pass  # its latency is fixed at start; nothing else is inspected

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(10)


def prompts_for(n: int) -> list[str]:
    return [f"bench prompt {i}" for i in range(n)]


def messages_for(prompt: str) -> list[dict]:
    return [{"role": "user", "content": prompt}]


def check(answers: list, n: int, method: str) -> None:
    """Every method must really have got N right answers, or its time means nothing."""
    assert len(answers) == n, f"{method}: {len(answers)} answers for {n} prompts"
    for i, answer in enumerate(answers):
        if isinstance(answer, BaseException):
            raise RuntimeError(f"{method}: prompt {i} failed: {answer!r}")
        if answer != f"echo: bench prompt {i}":
            raise RuntimeError(f"{method}: prompt {i} got {answer!r}")


def text_of(response) -> str:
    if isinstance(response, BaseException):
        return response  # type: ignore[return-value]
    return response.choices[0].message.content


class Bench:
    def __init__(self, server: ServerProcess):
        self.server = server
        self.base_url = server.base_url
        self.litellm_args = dict(
            model=MODEL, api_base=self.base_url, api_key=API_KEY, max_retries=0
        )
        self.loop = asyncio.new_event_loop()
        asyncio.set_event_loop(self.loop)
        self.pool = ThreadPoolExecutor(THREADS)
        self.openai_client = None
        self.aiohttp_session = None
        self.rlms: dict[int, rlm_magic.RLM] = {}

    def close(self) -> None:
        async def shutdown():
            if self.aiohttp_session is not None:
                await self.aiohttp_session.close()
            if self.openai_client is not None:
                await self.openai_client.close()

        self.loop.run_until_complete(shutdown())
        self.pool.shutdown()
        self.loop.close()

    # -- sync methods (run with the loop idle) ------------------------------------------
    def sequential(self, n: int) -> list:
        return [
            text_of(litellm.completion(messages=messages_for(p), **self.litellm_args))
            for p in prompts_for(n)
        ]

    def thread_pool(self, n: int) -> list:
        def one(p):
            return text_of(litellm.completion(messages=messages_for(p), **self.litellm_args))

        return list(self.pool.map(one, prompts_for(n)))

    def batch_completion(self, n: int) -> list:
        responses = litellm.batch_completion(
            messages=[messages_for(p) for p in prompts_for(n)], **self.litellm_args
        )
        return [text_of(r) for r in responses]

    # -- async methods (on self.loop) ----------------------------------------------------
    async def litellm_gather(self, n: int, concurrency: int | None = None) -> list:
        semaphore = asyncio.Semaphore(concurrency or n)

        async def one(p):
            async with semaphore:
                return text_of(
                    await litellm.acompletion(messages=messages_for(p), **self.litellm_args)
                )

        return await asyncio.gather(*(one(p) for p in prompts_for(n)))

    async def openai_gather(self, n: int) -> list:
        if self.openai_client is None:
            self.openai_client = openai.AsyncOpenAI(
                base_url=self.base_url, api_key=API_KEY, max_retries=0
            )
        client, semaphore = self.openai_client, asyncio.Semaphore(n)

        async def one(p):
            async with semaphore:
                response = await client.chat.completions.create(
                    model="bench", messages=messages_for(p)
                )
                return text_of(response)

        return await asyncio.gather(*(one(p) for p in prompts_for(n)))

    async def aiohttp_gather(self, n: int) -> list:
        if self.aiohttp_session is None:
            self.aiohttp_session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=0),
                headers={"Authorization": f"Bearer {API_KEY}"},
            )
        session, semaphore = self.aiohttp_session, asyncio.Semaphore(n)
        url = self.base_url + "/chat/completions"

        async def one(p):
            async with semaphore:
                async with session.post(
                    url, json={"model": "bench", "messages": messages_for(p)}
                ) as reply:
                    reply.raise_for_status()
                    body = await reply.json()
                return body["choices"][0]["message"]["content"]

        return await asyncio.gather(*(one(p) for p in prompts_for(n)))

    def rlm(self, concurrency: int) -> rlm_magic.RLM:
        if concurrency not in self.rlms:
            self.rlms[concurrency] = rlm_magic.RLM(
                model=MODEL,
                sub_model=MODEL,
                api_base=self.base_url,
                api_key=API_KEY,
                max_concurrency=concurrency,
                progress=False,
                max_retries=0,
            )
        return self.rlms[concurrency]

    async def llm_query_batch(self, n: int, concurrency: int | None = None) -> list:
        return await helpers(self.rlm(concurrency or n)).llm_query_batch(prompts_for(n))

    # -- timing --------------------------------------------------------------------------
    def run(self, method, n: int, **kwargs) -> list:
        if asyncio.iscoroutinefunction(method):
            return self.loop.run_until_complete(method(n, **kwargs))
        return method(n, **kwargs)

    def settle(self) -> None:
        """Run the tasks a batch left behind (litellm schedules its success logging as
        background tasks, which a bare gather returns before running), so they are not
        billed to the next measurement. Not timed."""

        def finite(task) -> bool:  # litellm's LoggingWorker._worker_loop never ends
            return not getattr(task.get_coro(), "__qualname__", "").endswith("_worker_loop")

        async def drain():
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                pending = {t for t in asyncio.all_tasks() - {asyncio.current_task()} if finite(t)}
                if not pending:
                    return
                await asyncio.wait(pending, timeout=1.0)
            await asyncio.sleep(0.05)

        self.loop.run_until_complete(drain())

    def time(self, name: str, method, n: int, reps: int) -> float:
        times = []
        for _ in range(reps):
            self.server.reset()
            started = time.perf_counter()
            answers = self.run(method, n)
            times.append(time.perf_counter() - started)
            check(answers, n, name)
            self.settle()
            if times[0] > SLOW_CELL_S:
                break
        return statistics.median(times)

    def heartbeat(self, method, n: int, concurrency: int) -> float:
        """Largest lateness (s) of a 10 ms sleep loop running beside one batch."""

        async def go():
            worst = 0.0
            stop = asyncio.Event()

            async def beat():
                nonlocal worst
                while not stop.is_set():
                    before = time.perf_counter()
                    await asyncio.sleep(0.01)
                    worst = max(worst, time.perf_counter() - before - 0.01)

            beater = asyncio.ensure_future(beat())
            await asyncio.sleep(0.02)
            try:
                answers = await method(n, concurrency=concurrency)
            finally:
                stop.set()
                await beater
            check(answers, n, method.__name__)
            return worst

        self.server.reset()
        try:
            return self.loop.run_until_complete(go())
        finally:
            self.settle()


COLUMNS = [  # (header, method name, largest N it runs for)
    ("sequential `completion`", "sequential", SEQUENTIAL_MAX_N),
    (f"{THREADS} threads `completion`", "thread_pool", None),
    ("`batch_completion`", "batch_completion", None),
    ("gather `acompletion`", "litellm_gather", None),
    ("gather `AsyncOpenAI`", "openai_gather", None),
    ("gather aiohttp (floor)", "aiohttp_gather", None),
    ("`llm_query_batch`", "llm_query_batch", None),
]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="N = 4, 16, 64 and one run per cell")
    parser.add_argument(
        "--latency",
        type=float,
        default=0.3,
        help="seconds the fake server waits before answering (0.3)",
    )
    parser.add_argument(
        "--reps", type=int, default=None, help="runs per cell, median taken (3; 1 with --quick)"
    )
    args = parser.parse_args()
    sizes = [4, 16, 64] if args.quick else [4, 16, 64, 256]
    reps = args.reps or (1 if args.quick else 3)
    total_started = time.perf_counter()

    print("# rlm-magic batch benchmark\n")
    print(
        f"Wall seconds to get N answers from a local OpenAI-compatible server "
        f"(tests/support/llm_server.py) answering after {args.latency:g} s; median of {reps} "
        f"run(s) per cell (cells slower than {SLOW_CELL_S:g} s: 1 run), each method "
        f"warmed up once. Concurrency = N for the gathers and llm_query_batch.\n"
    )
    print(
        f"- Python {platform.python_version()} ({platform.python_implementation()}), "
        f"{platform.system()} {platform.machine()}, CPUs: {os.cpu_count()}"
    )
    versions = ", ".join(
        f"{pkg} {importlib.metadata.version(pkg)}"
        for pkg in ("litellm", "openai", "httpx", "aiohttp")
    )
    print(f"- {versions}, rlm-magic {rlm_magic.__version__}")
    print(
        f"- litellm calls: model={MODEL}, api_base=<local>, max_retries=0; "
        f"llm_query_batch: RLM(max_concurrency=N, progress=False, max_retries=0)\n"
    )

    server = ServerProcess(args.latency)
    bench = Bench(server)
    bench.latency = args.latency
    try:
        for _, name, _ in COLUMNS:  # warm-up: imports, client caches, connection pools
            server.reset()
            bench.run(getattr(bench, name), 4)
            bench.settle()

        table: dict[tuple[str, int], float] = {}
        notes: list[str] = []
        for n in sizes:
            for _, name, max_n in COLUMNS:
                if max_n is None or n <= max_n:
                    try:
                        table[name, n] = bench.time(name, getattr(bench, name), n, reps)
                    except Exception as exc:  # noqa: BLE001 - shown under the table
                        table[name, n] = float("nan")
                        notes.append(f"- {name} at N={n} failed: {str(exc)[:200]}")
                        bench.settle()
            print(f"  ... N={n} done", file=sys.stderr, flush=True)

        print("| N | " + " | ".join(header for header, _, _ in COLUMNS) + " |")
        print("|---:|" + "---:|" * len(COLUMNS))
        for n in sizes:
            cells = [
                (
                    ""
                    if (name, n) not in table
                    else "failed*"
                    if table[name, n] != table[name, n]
                    else f"{table[name, n]:.2f}"
                )
                for _, name, _ in COLUMNS
            ]
            print(f"| {n} | " + " | ".join(cells) + " |")
        if notes:
            print("\n*" + "\n".join(notes))

        print("\n## llm_query_batch relative to the others\n")
        print("| N | / gather `acompletion` | / aiohttp floor |")
        print("|---:|---:|---:|")
        for n in [s for s in sizes if s >= 64]:
            ours = table["llm_query_batch", n]
            print(
                f"| {n} | {ours / table['litellm_gather', n]:.2f}x | "
                f"{ours / table['aiohttp_gather', n]:.2f}x |"
            )

        hb_n = HEARTBEAT_N if not args.quick else 64
        print(
            f"\n## Loop stalls: largest lateness of a 10 ms heartbeat during N={hb_n} "
            f"batches at concurrency {HEARTBEAT_CONCURRENCY} ({reps} run(s) each)\n"
        )
        print("| method | worst (ms) | each run (ms) |")
        print("|---|---:|---|")
        for label, name in (
            ("gather `acompletion` (semaphore 64)", "litellm_gather"),
            ("`llm_query_batch` (max_concurrency=64)", "llm_query_batch"),
        ):
            method = getattr(bench, name)
            bench.heartbeat(method, 16, HEARTBEAT_CONCURRENCY)  # warm this concurrency
            delays = [
                bench.heartbeat(method, hb_n, HEARTBEAT_CONCURRENCY) * 1000 for _ in range(reps)
            ]
            print(
                f"| {label} | {max(delays):.0f} | " + ", ".join(f"{d:.0f}" for d in delays) + " |"
            )
    finally:
        bench.close()
        server.stop()
    print(f"\n(total benchmark time {time.perf_counter() - total_started:.0f} s)")


if __name__ == "__main__":
    main()
