"""A provider batch job of 10,000 requests: how long the loop stalls, and memory.

Run from the repo root:  python benchmarks/bench_batch_job.py [--n 10000] [--chars 400]

``llm_query_batch(prompts, batch_job=True)`` runs against the Files + Batches API of
``tests/support/llm_server.py``, in a process of its own (in a thread of this one its work
would compete with the client for the GIL). A 5 ms heartbeat task on the same loop
measures the longest stall over the whole job: writing and uploading the file, polling,
downloading and reading the results. Memory is the growth of the process's peak RSS
(``ru_maxrss``) from just before the call (litellm imported, prompts built) to the end.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import resource
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

from benchmarks.bench_batch import ServerProcess  # noqa: E402
from rlm_magic import RLM  # noqa: E402
from rlm_magic.jupyter.helpers import NotebookHelpers as helpers  # noqa: E402
from rlm_magic.llm.litellm_loader import import_litellm  # noqa: E402
from rlm_magic.maps.jobs import batch_job  # noqa: E402


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


async def heartbeat(stalls: list[tuple[float, float]], period: float = 0.005) -> None:
    loop = asyncio.get_running_loop()
    started = loop.time()
    while True:
        expected = loop.time() + period
        await asyncio.sleep(period)
        stalls.append((loop.time() - expected, expected - started))


async def main(n: int, chars: int) -> None:
    import_litellm()
    batch_job.FIRST_POLL_S, batch_job.MAX_POLL_S = 0.2, 0.5
    server = ServerProcess(latency=0.0)
    try:
        with tempfile.TemporaryDirectory() as cache:
            rlm = RLM(
                model="openai/bench",
                sub_model="openai/gpt-4o-mini",
                api_base=server.base_url,
                api_key="sk-bench",
                progress=False,
                cache_dir=cache,
            )
            filler = "The delivery was late but the product works well enough. " * 20
            prompts = [f"Sentiment of review {i}: {filler[:chars]}" for i in range(n)]
            await asyncio.sleep(0.1)
            before = peak_rss_mb()
            stalls: list[float] = []
            beat = asyncio.ensure_future(heartbeat(stalls))
            started = time.perf_counter()
            answers = await helpers(rlm).llm_query_batch(prompts, batch_job=True)
            elapsed = time.perf_counter() - started
            beat.cancel()
            grown = peak_rss_mb() - before
            assert len(answers) == n and answers[7] == "echo: " + prompts[7]
            usage = rlm.client.ledger.summary()
            stalls.sort()
            print(f"{n:,} requests of ~{chars} characters as one batch job: {elapsed:.1f} s")
            print(
                f"loop stall: max {stalls[-1][0] * 1000:.1f} ms (at {stalls[-1][1]:.1f} s), "
                f"p99 {stalls[int(len(stalls) * 0.99)][0] * 1000:.1f} ms over "
                f"{len(stalls):,} beats"
            )
            print(f"peak RSS grew by {grown:.0f} MB during the job")
            print(f"cost at batch prices: ${usage.cost_usd:.4f} for {usage.calls:,} calls")
    finally:
        server.stop()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=10_000)
    parser.add_argument("--chars", type=int, default=400)
    args = parser.parse_args()
    asyncio.run(main(args.n, args.chars))
