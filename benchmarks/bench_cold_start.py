"""The first model call of a fresh process, with and without importing litellm, side by
side in one run.

Run from the repo root:  python benchmarks/bench_cold_start.py [--runs 3]

Each run is a fresh interpreter that has imported rlm_magic (as a kernel has after
``%load_ext rlm_magic``) and sends one ``llm_query`` to an OpenAI-compatible endpoint
(``tests/llm_server.py``, in this process, answering at once). Reported per mode, the
median of the runs:

- **time to request**: from the call's start to the request's arrival at the server
  (both read ``time.monotonic``, one clock for every process of the machine);
- **call**: the whole call, answer included;
- **RSS +**: the process's resident memory after the call less before it;
- whether ``litellm`` was imported.

Modes: ``wire, no import`` (today: prices from litellm's bundled price map file, no
import); ``wire + import`` (as before: the first call imports litellm, in a thread,
before the request leaves).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tests.llm_server import FakeLLMServer  # noqa: E402

CHILD = r"""
import asyncio, json, sys, time

def rss_mb():
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024

from rlm_magic import RLM
from rlm_magic.jupyter.helpers import NotebookHelpers

if sys.argv[2] == "import":  # as before: every call waited for litellm's import
    from rlm_magic.llm.endpoints import ProviderEndpoint
    ProviderEndpoint._light_route = lambda self, model: None

async def main():
    rlm = RLM(model="openai/gpt-4o-mini", api_base=sys.argv[1], api_key="sk-test",
              progress=False)
    before = rss_mb()
    started = time.monotonic()
    answer = await NotebookHelpers(rlm).llm_query("hi")
    ended = time.monotonic()
    record = rlm.client.ledger.records[-1]
    print(json.dumps({"answer": answer, "started": started, "call": ended - started,
                      "rss": rss_mb() - before, "litellm": "litellm" in sys.modules,
                      "cost": record.cost_usd}))

asyncio.run(main())
"""

MODES = {"wire, no import": "light", "wire + import": "import"}


def one(server: FakeLLMServer, mode: str) -> dict:
    server.reset()
    done = subprocess.run(
        [sys.executable, "-c", CHILD, server.base_url, mode],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=300,
    )
    if done.returncode:
        raise SystemExit(done.stderr)
    result = json.loads(done.stdout)
    assert result["answer"] == "echo: hi", result
    result["to_request"] = server.arrivals[0] - result["started"]
    return result


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=3)
    runs = parser.parse_args().runs
    server = FakeLLMServer().start()
    try:
        results: dict[str, list[dict]] = {name: [] for name in MODES}
        for _ in range(runs):  # interleaved: the machine's load falls on both alike
            for name, mode in MODES.items():
                results[name].append(one(server, mode))
    finally:
        server.stop()
    print(f"first llm_query in a fresh process, median of {runs} runs")
    print(f"{'mode':<18}{'time to request':>17}{'call':>9}{'RSS +':>10}  litellm  cost")
    for name, rows in results.items():
        to_request = statistics.median(r["to_request"] for r in rows)
        call = statistics.median(r["call"] for r in rows)
        rss = statistics.median(r["rss"] for r in rows)
        imported = {r["litellm"] for r in rows}
        costs = {r["cost"] for r in rows}
        print(
            f"{name:<18}{to_request:>16.3f}s{call:>8.3f}s{rss:>8.1f}MB  "
            f"{'yes' if imported == {True} else 'no' if imported == {False} else imported}"
            f"      {', '.join(map(str, costs))}"
        )


if __name__ == "__main__":
    main()
