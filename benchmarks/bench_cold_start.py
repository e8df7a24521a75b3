"""The first model call of a fresh process: how long until its request reaches the
server, and whether litellm was imported, at each setting that once imported it.

Run from the repo root:  python benchmarks/bench_cold_start.py [--runs 3] [--code DIR]

Each run is a fresh interpreter that has imported rlm_magic (as a kernel has after
``%load_ext rlm_magic``) and sends one ``llm_query`` (or a batch of 8) to an
OpenAI-compatible endpoint (``tests/support/llm_server.py``, in this process, answering at once).
``--code DIR``: the rlm_magic the children run, e.g. an older commit's
(``git archive <commit> | tar -x -C DIR``), to measure before and after side by side.
Reported per case, the median of the runs:

- **time to request**: from the call's start to the first request's arrival at the
  server (both read ``time.monotonic``, one clock for every process of the machine);
- **call**: the whole call, answer included;
- **RSS +**: the process's resident memory after the call less before it;
- whether ``litellm`` was imported.

Cases: ``wire, no import`` (prices from litellm's bundled price map file, no import);
``wire + import`` (as before that: the first call imports litellm, in a thread, before
the request leaves); then a llama.cpp server with a 4,096-token window, where at the
default ``max_tokens`` (4,096) every prompt is near the window: its count imported
litellm (5 s) until the count went without it (the server's ``/tokenize``, else a
cautious estimate), and so did a budget.
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

from tests.support.llm_server import FakeLLMServer  # noqa: E402

CHILD = r"""
import asyncio, json, sys, time

def rss_mb():
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024

from rlm_magic import RLM
from rlm_magic.jupyter.helpers import NotebookHelpers

how = json.loads(sys.argv[2])
if how.get("import"):  # as before: every call waited for litellm's import
    from rlm_magic.llm.endpoints import ProviderEndpoint
    ProviderEndpoint._light_route = lambda self, model: None

async def main():
    rlm = RLM(api_base=sys.argv[1], api_key="sk-test", progress=False, **how["settings"])
    helpers = NotebookHelpers(rlm)
    before = rss_mb()
    started = time.monotonic()
    if how.get("batch"):
        answer = (await helpers.llm_query_batch([f"{i} {how['prompt']}" for i in range(8)]))[0]
    else:
        answer = await helpers.llm_query(how["prompt"])
    ended = time.monotonic()
    record = rlm.client.ledger.records[-1]
    print(json.dumps({"answer": answer, "started": started, "call": ended - started,
                      "rss": rss_mb() - before, "litellm": "litellm" in sys.modules,
                      "cost": record.cost_usd}))

asyncio.run(main())
"""

NEAR = "word " * 1600  # ~2,000 tokens: half of a 4,096-token window
SUB = {"model": "openai/sub-model"}
# name: (what the child does, the server plays llama.cpp with a 4,096 window, /tokenize)
CASES: dict[str, tuple[dict, bool, bool]] = {
    "wire, no import": (
        {"settings": {"model": "openai/gpt-4o-mini"}, "prompt": "hi"},
        False,
        False,
    ),
    "wire + import": (
        {"settings": {"model": "openai/gpt-4o-mini"}, "prompt": "hi", "import": True},
        False,
        False,
    ),
    "4k, max_tokens=4": ({"settings": {**SUB, "max_tokens": 4}, "prompt": "hi"}, True, False),
    "4k, default": ({"settings": SUB, "prompt": "hi"}, True, False),
    "4k, 2k prompt": ({"settings": SUB, "prompt": NEAR}, True, False),
    "4k, 2k, /tokenize": ({"settings": SUB, "prompt": NEAR}, True, True),
    "4k, batch of 8": ({"settings": SUB, "prompt": "hi", "batch": True}, True, False),
    "4k, budget": (
        {"settings": {**SUB, "max_session_cost_usd": 1.0}, "prompt": NEAR},
        True,
        False,
    ),
    "4k, priced, budget": (
        {
            "settings": {"model": "openai/gpt-4o-mini", "max_session_cost_usd": 1.0},
            "prompt": NEAR,
        },
        True,
        False,
    ),
}


def one(server: FakeLLMServer, case: str, code: Path) -> dict:
    how, llama_cpp, tokenizes = CASES[case]
    server.reset()
    if llama_cpp:
        server.reports_window = ("llama.cpp", 4096)
    server.tokenizes = tokenizes
    done = subprocess.run(
        [sys.executable, "-c", CHILD, server.base_url, json.dumps(how)],
        capture_output=True,
        text=True,
        cwd=code,
        timeout=300,
    )
    if done.returncode:
        raise SystemExit(done.stderr)
    result = json.loads(done.stdout)
    assert result["answer"].startswith("echo: "), result
    result["to_request"] = server.arrivals[0] - result["started"]
    return result


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--code", type=Path, default=ROOT, help="the rlm_magic to run")
    arguments = parser.parse_args()
    runs, code = arguments.runs, arguments.code.resolve()
    server = FakeLLMServer().start()
    try:
        results: dict[str, list[dict]] = {name: [] for name in CASES}
        for _ in range(runs):  # interleaved: the machine's load falls on all alike
            for name in CASES:
                results[name].append(one(server, name, code))
    finally:
        server.stop()
    print(f"first llm_query in a fresh process ({code}), median of {runs} runs")
    print(f"{'case':<20}{'time to request':>17}{'call':>9}{'RSS +':>10}  litellm  cost")
    for name, rows in results.items():
        to_request = statistics.median(r["to_request"] for r in rows)
        call = statistics.median(r["call"] for r in rows)
        rss = statistics.median(r["rss"] for r in rows)
        imported = {r["litellm"] for r in rows}
        costs = {r["cost"] for r in rows}
        print(
            f"{name:<20}{to_request:>16.3f}s{call:>8.3f}s{rss:>8.1f}MB  "
            f"{'yes' if imported == {True} else 'no' if imported == {False} else imported}"
            f"      {', '.join(map(str, costs))}"
        )


if __name__ == "__main__":
    main()
