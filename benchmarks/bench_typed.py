"""CPU per call of typed answers (``response_format=``) against plain strings.

Run from the repo root:  python benchmarks/bench_typed.py [--n 1000] [--reps 3]

The same ``llm_query_batch`` of N prompts runs plain and with a pydantic model, against
``tests/support/llm_server.py`` in a process of its own answering at once with the same JSON
object either way. The client process's CPU time (``time.process_time``) is divided by
N; plain and typed runs alternate, and the medians are compared.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Literal

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

from pydantic import BaseModel  # noqa: E402

from rlm_magic import RLM  # noqa: E402
from rlm_magic.jupyter.helpers import NotebookHelpers as helpers  # noqa: E402
from rlm_magic.llm.litellm_loader import import_litellm  # noqa: E402

SERVER = """
import json, sys, threading
from tests.support.llm_server import FakeLLMServer
server = FakeLLMServer().start()
server.requests = type("Discard", (list,), {"append": lambda self, item: None})()
server.default_reply = json.dumps({"sentiment": "positive", "score": 3, "reason": "it works"})
print(server.base_url, flush=True)
threading.Event().wait()
"""


class Label(BaseModel):
    sentiment: Literal["positive", "negative", "neutral"]
    score: int
    reason: str


async def cpu_per_call(rlm: RLM, n: int, typed: bool) -> float:
    prompts = [f"Sentiment of review {i}: it works" for i in range(n)]
    started = time.process_time()
    answers = await helpers(rlm).llm_query_batch(
        prompts, response_format=Label if typed else None, resume=False
    )
    spent = time.process_time() - started
    assert len(answers) == n and (isinstance(answers[0], Label) == typed)
    return spent / n * 1000


async def main(n: int, reps: int) -> None:
    import_litellm()
    server = subprocess.Popen(
        [sys.executable, "-c", SERVER], cwd=ROOT, stdout=subprocess.PIPE, text=True
    )
    try:
        base_url = server.stdout.readline().strip()
        rlm = RLM(
            model="openai/bench",
            sub_model="openai/bench",
            api_base=base_url,
            api_key="sk-bench",
            progress=False,
            max_concurrency=64,
        )
        await cpu_per_call(rlm, 64, False)  # warm up: imports, connections
        await cpu_per_call(rlm, 64, True)
        plain, typed = [], []
        for _ in range(reps):
            plain.append(await cpu_per_call(rlm, n, False))
            typed.append(await cpu_per_call(rlm, n, True))
        p, t = statistics.median(plain), statistics.median(typed)
        print(
            f"{n:,} calls, median of {reps}: plain {p:.2f} ms CPU per call, "
            f"typed {t:.2f} ms ({(t / p - 1) * 100:+.1f}%)"
        )
    finally:
        server.terminate()
        server.wait(10)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=1000)
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args()
    asyncio.run(main(args.n, args.reps))
