"""How ``llm_query_batch`` does against a provider's rate limit, with no settings.

Run from the repo root:  python benchmarks/bench_ratelimit.py [--reps 3]

The local test server (``tests/support/llm_server.py``) enforces a limit as a real provider
does: token buckets for requests and/or prompt tokens per second, answering excess
requests at once with HTTP 429, ``retry-after`` and (unless told not to) OpenAI's
``x-ratelimit-*`` headers. Each scenario runs on a fresh event loop, so nothing learned
in one carries over to the next. Reported per scenario:

- wall time, against what the limit allows: (work - burst) / rate + latency (with no
  limit, a latency per round of requests at the concurrency);
- failed items (the target is 0) and rejected requests as a share of the items
  (the target is at most 10%), and how many of them answered the first burst (sent
  before anything could be known about the limit).

The first burst goes out whole before any answer or 429 comes back (measured: its 16
requests pass the gate within ~45 ms; the first 429 reaches it ~20 ms after the last),
so what it sends past the server's burst is refused: with the server counting 1.5x our
estimate, 16 prompts of 3,000 tokens against a burst of 20,000 make 10 refusals of 60
(17%) whatever the gate learns after. Holding the rest of a new gate's first burst back
until the first answer refused none there (1.11x its floor), but cost a batch against
a server with no limit one latency (1.07x -> 1.35x its floor): not done.

Quantized limits (OpenAI's "may be quantized", Azure's RPM over 1 s windows) announce the
minute's budget in their headers while a far smaller bucket is enforced, and counted in
``remaining``: those scenarios are marked "quantized". OpenAI's own headers announce the
minute's budget with what is left of it (``remaining`` and ``reset`` then tell the true
rate, not the small burst enforced): those are marked "as OpenAI's do", one of them with a
server that counts 1.5 times the tokens our estimate does (another tokenizer). The
server runs in a process of its own, so its CPU is not counted against the client.
``--latency`` sets the server's (0.3 s): at longer ones, how many requests are kept in
flight matters too. ``--per-call`` times only what the gate adds to every call.

``compare_rlms_ratelimit.py`` runs the official RLM library's batch against the same
server, from a scratch environment.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

from rlm_magic import RLM  # noqa: E402
from rlm_magic.jupyter.helpers import NotebookHelpers as helpers  # noqa: E402

LATENCY = 0.3


@dataclass
class Scenario:
    name: str
    prompts: int
    prompt_chars: int
    max_concurrency: int
    limit: dict  # FakeLLMServer.limit_rate arguments

    def ideal_s(self) -> float:
        """The shortest wall time the limit allows: the burst at once, the rest at the
        refill rate, then one latency for the last answer. With no limit: a latency
        for each round of ``max_concurrency`` requests."""
        if not self.limit:
            return math.ceil(self.prompts / self.max_concurrency) * LATENCY
        if self.limit.get("tps"):
            counted = self.prompt_chars // 4 * self.limit.get("token_factor", 1.0)
            work = self.prompts * counted
            rate, burst = self.limit["tps"], self.limit.get("token_burst") or self.limit["tps"]
        else:
            work = self.prompts
            rate, burst = self.limit["rps"], self.limit.get("burst") or self.limit["rps"]
        return max(0.0, work - burst) / rate + LATENCY


SCENARIOS = [
    # No limit at all: what the gate costs a provider that never refuses (nothing may
    # hold the first requests back waiting to learn a limit).
    Scenario("no limit; 300 prompts at concurrency 64", 300, 40, 64, {}),
    Scenario("no limit; 60 prompts of 2,000 tokens at the default concurrency", 60, 8000, 16, {}),
    Scenario(
        "50 requests/s, burst 50; 300 prompts at concurrency 64",
        300,
        40,
        64,
        {"rps": 50, "burst": 50},
    ),
    Scenario(
        "50 requests/s, burst 50; 300 prompts at the default concurrency 16",
        300,
        40,
        16,
        {"rps": 50, "burst": 50},
    ),
    Scenario(
        "20k tokens/s; 60 prompts of 2,000 tokens at the default concurrency",
        60,
        8000,
        16,
        {"tps": 20_000, "token_burst": 20_000},
    ),
    Scenario(
        "20k tokens/s and 100 requests/s, headers announcing the minute's budgets (1.2M "
        "tokens, 6,000 requests) as OpenAI's do; 60 prompts of 2,000 tokens at the default "
        "concurrency",
        60,
        8000,
        16,
        {"rps": 100, "tps": 20_000, "token_burst": 20_000, "minute_headers": True},
    ),
    Scenario(
        "as above, the server counting 1.5x our estimate (3,000 tokens a prompt)",
        60,
        8000,
        16,
        {
            "rps": 100,
            "tps": 20_000,
            "token_burst": 20_000,
            "minute_headers": True,
            "token_factor": 1.5,
        },
    ),
    Scenario(
        "50 requests/s, burst 50, headers announcing the minute's budget (3,000) as "
        "OpenAI's do; 300 prompts at concurrency 64",
        300,
        40,
        64,
        {"rps": 50, "burst": 50, "minute_headers": True},
    ),
    Scenario(
        "50 requests/s, no rate-limit headers at all; 300 prompts at 64",
        300,
        40,
        64,
        {"rps": 50, "burst": 50, "headers": "none"},
    ),
    Scenario(
        "50 requests/s, retry-after only; 300 prompts at 64",
        300,
        40,
        64,
        {"rps": 50, "burst": 50, "headers": "retry-after"},
    ),
    Scenario(
        "quantized: 50 requests/s enforced (burst 50), headers announcing 3,000/min; "
        "300 prompts at the default concurrency 16",
        300,
        40,
        16,
        {"rps": 50, "burst": 50, "announce_rpm": 3000},
    ),
    Scenario(
        "quantized, as above; 300 prompts at concurrency 64",
        300,
        40,
        64,
        {"rps": 50, "burst": 50, "announce_rpm": 3000},
    ),
    Scenario(
        "quantized: 20k tokens/s enforced, headers announcing 1.2M/min; 60 prompts "
        "of 2,000 tokens at the default concurrency",
        60,
        8000,
        16,
        {"tps": 20_000, "token_burst": 20_000, "announce_tpm": 1_200_000},
    ),
]


class ServerProcess:
    """tests/support/llm_server.py with one scenario's limit, in a process of its own."""

    def __init__(self, limit: dict):
        args = [sys.executable, "-m", "tests.support.llm_server", "--latency", str(LATENCY)]
        for name, value in limit.items():
            flag = f"--{name.replace('_', '-')}"
            args += [flag] if value is True else [flag, str(value)]
        self.process = subprocess.Popen(
            args, cwd=ROOT, stdout=subprocess.PIPE, stdin=subprocess.PIPE, text=True
        )
        self.base_url = self.process.stdout.readline().strip()

    def stats(self) -> dict:
        self.process.stdin.write("stats\n")
        self.process.stdin.flush()
        return json.loads(self.process.stdout.readline())

    def rejected(self) -> int:
        return self.stats()["rejected"]

    def stop(self) -> None:
        self.process.kill()
        self.process.wait(10)


# 429s this soon after the batch's first one, itself before any answer could come back,
# answer its first burst, sent before anything could be known about the limit (clocks:
# time.monotonic() is the system's, the same in both processes).
BLIND_S = 0.1


async def run_once(server: ServerProcess, scenario: Scenario) -> tuple[float, int, int, int]:
    """Wall time, failed items, 429s, and 429s to the first burst."""
    before = server.rejected()
    rlm = RLM(
        model="openai/bench",
        api_base=server.base_url,
        api_key="sk-bench",
        progress=False,
        max_concurrency=scenario.max_concurrency,
    )
    body = "x" * (scenario.prompt_chars - 8)
    prompts = [f"{i:06d} {body}" for i in range(scenario.prompts)]
    started, began = time.perf_counter(), time.monotonic()
    answers = await helpers(rlm).llm_query_batch(prompts, return_exceptions=True)
    wall = time.perf_counter() - started
    failed = sum(isinstance(a, BaseException) for a in answers)
    from rlm_magic.llm.transports import close_loop_clients

    await close_loop_clients()
    stats = server.stats()
    refused = sorted(t for t in stats["rejected_at"] if t >= began)
    blind = 0
    if refused and refused[0] < began + LATENCY:
        blind = sum(t < refused[0] + BLIND_S for t in refused)
    return wall, failed, stats["rejected"] - before, blind


async def warm_up() -> None:
    """Import litellm before anything is timed (it takes seconds, once)."""
    from rlm_magic.llm.litellm_loader import load_litellm

    await load_litellm()


# An answer's headers as aiohttp gives them, without and with OpenAI's rate-limit headers.
PLAIN_HEADERS = {
    "Content-Type": "application/json",
    "Content-Length": "312",
    "Date": "Thu, 26 Nov 2026 23:00:00 GMT",
    "x-request-id": "req_abc",
    "openai-processing-ms": "120",
}
OPENAI_HEADERS = {
    **PLAIN_HEADERS,
    "x-ratelimit-limit-requests": "10000",
    "x-ratelimit-remaining-requests": "9999",
    "x-ratelimit-reset-requests": "6ms",
    "x-ratelimit-limit-tokens": "1200000",
    "x-ratelimit-remaining-tokens": "1199000",
    "x-ratelimit-reset-tokens": "50ms",
}


async def per_call_us() -> dict[str, float]:
    """Microseconds the gate adds to every call (the best of 9 timeit runs): finding
    the call's gate, reading an answer's headers, learning from an answer."""
    import timeit

    from multidict import CIMultiDict, CIMultiDictProxy

    from rlm_magic.llm.ratelimit import RateGate, Ticket, gate_for, read_headers

    number, repeat = 5000, 9

    def best(call) -> float:
        return min(timeit.repeat(call, number=number, repeat=repeat)) / number * 1e6

    found = {"gate_for": best(lambda: gate_for("openai/m", None, "sk-" + "k" * 48))}
    for name, raw in (("no rate-limit headers", PLAIN_HEADERS), ("OpenAI's", OPENAI_HEADERS)):
        headers = CIMultiDictProxy(CIMultiDict(raw))
        found[f"read_headers, {name}"] = best(lambda headers=headers: read_headers(headers))
        gate = RateGate("m")
        for _ in range(number * repeat):
            await gate.slots.acquire()
        tickets = iter([Ticket(100.0, time.monotonic(), estimate=100.0)] * (number * repeat))
        found[f"RateGate.answered, {name}"] = best(
            lambda gate=gate, tickets=tickets, headers=headers: gate.answered(
                next(tickets), headers, 100, 400
            )
        )
    return found


def main() -> None:
    global LATENCY
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--only", help="run the scenarios whose name contains this")
    parser.add_argument("--latency", type=float, default=0.3, help="the server's, seconds")
    parser.add_argument(
        "--per-call", action="store_true", help="only what the gate adds to each call, in µs"
    )
    args = parser.parse_args()
    LATENCY = args.latency
    if args.per_call:
        for name, micros in asyncio.run(per_call_us()).items():
            print(f"{name:40s} {micros:6.2f} µs")
        return
    asyncio.run(warm_up())
    print(f"latency {LATENCY}s; {args.reps} runs per scenario, each on a fresh loop\n")
    for scenario in SCENARIOS:
        if args.only and args.only not in scenario.name:
            continue
        server = ServerProcess(scenario.limit)
        runs = []
        for _ in range(args.reps):
            time.sleep(1.5)  # the server's buckets fill up again
            runs.append(asyncio.run(run_once(server, scenario)))
        server.stop()
        ideal = scenario.ideal_s()
        walls = [w for w, _, _, _ in runs]
        print(scenario.name)
        print(
            f"  ideal {ideal:.2f}s | wall "
            + " / ".join(f"{w:.2f}s" for w in walls)
            + f" | ratio {statistics.median(walls) / ideal:.2f}x (median)"
        )
        print(
            "  failed "
            + " / ".join(str(f) for _, f, _, _ in runs)
            + " | rejected "
            + " / ".join(f"{r} ({r / scenario.prompts:.0%})" for _, _, r, _ in runs)
            + " | of them in the first burst "
            + " / ".join(str(b) for _, _, _, b in runs)
        )


if __name__ == "__main__":
    main()
