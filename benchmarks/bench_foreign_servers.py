"""The client against servers that are not ours (``tests/support/foreign_servers.py``).

Run from the repo root:  python benchmarks/bench_foreign_servers.py [--reps 3]
                         [--code /path/to/another/checkout]  (its rlm_magic, side by side)

Two parts, each server in a process of its own (its CPU is not the client's):

- **Token limits, whatever the server counts.** A provider allowing 20,000 tokens/s
  (a second's burst enforced, the minute's budget of 1.2M announced in its headers),
  ``retry-after`` in whole seconds, a refusal that does not say what the request counted,
  0.3 s a call. It counts prompts by its own tokenizer at k = 0.5, 1, 2 and 4 times our
  estimate (dense words, CJK text). 60 prompts of 2,000 tokens (as it counts them) at the
  default concurrency: the floor is (120,000 - 20,000) / 20,000 s + 0.3 s = 5.3 s.
  Printed: wall time over the floor, and the 429s as a share of the prompts (the first
  16 requests go out before anything is known, and 6 of them are refused whatever the
  client does after: 10%).
- **A server that closes every connection.** llama.cpp-like: 8 slots, each connection
  closed right after its streamed answer (at once, or 20 ms later, reading nothing
  meanwhile) though it announced keep-alive; 64 prompts at ``timeout=2``. Printed:
  answers, retries, and requests the server read, on the wire transport and through
  litellm.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

LATENCY = 0.3
PROMPTS, PROMPT_TOKENS, TOKENS_PER_S = 60, 2_000, 20_000
FLOOR_S = (PROMPTS * PROMPT_TOKENS - TOKENS_PER_S) / TOKENS_PER_S + LATENCY


class ServerProcess:
    """A foreign server with one behaviour, in a process of its own."""

    def __init__(self, behaviour: dict):
        self.process = subprocess.Popen(
            [sys.executable, "-m", "tests.support.foreign_servers", json.dumps(behaviour)],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stdin=subprocess.PIPE,
            text=True,
        )
        self.base_url = self.process.stdout.readline().strip()

    def ask(self, line: str) -> dict:
        self.process.stdin.write(line + "\n")
        self.process.stdin.flush()
        return json.loads(self.process.stdout.readline())

    def stop(self) -> None:
        self.process.kill()
        self.process.wait(10)


async def token_run(server: ServerProcess, k: float, wire: bool) -> tuple[float, int, int]:
    """Wall time, failed items, 429s."""
    from rlm_magic import RLM
    from rlm_magic.jupyter.helpers import NotebookHelpers
    from rlm_magic.llm.transports import close_loop_clients
    from tests.support.foreign_servers import text_counting

    server.ask("reset")
    rlm = RLM(
        model="openai/bench",
        api_base=server.base_url,
        api_key="sk-bench",
        progress=False,
        wire_transport=wire,
    )
    prompts = [text_counting(k, PROMPT_TOKENS, f"p{i}") for i in range(PROMPTS)]
    started = time.perf_counter()
    answers = await NotebookHelpers(rlm).llm_query_batch(prompts, return_exceptions=True)
    wall = time.perf_counter() - started
    await close_loop_clients()
    failed = sum(isinstance(a, BaseException) for a in answers)
    return wall, failed, server.ask("stats")["rejected"]


async def closing_run(server: ServerProcess, wire: bool) -> tuple[int, int, int]:
    """Answers, retries, requests the server read (a free resend reads one again)."""
    from rlm_magic import RLM
    from rlm_magic.jupyter.helpers import NotebookHelpers
    from rlm_magic.llm.transports import close_loop_clients

    server.ask("reset")
    rlm = RLM(
        model="openai/bench",
        api_base=server.base_url,
        api_key="sk-bench",
        progress=False,
        timeout=2,
        stream=True,
        wire_transport=wire,
    )
    prompts = [f"prompt {i}" for i in range(64)]
    answers = await NotebookHelpers(rlm).llm_query_batch(prompts, return_exceptions=True)
    await close_loop_clients()
    answered = sum(not isinstance(a, BaseException) for a in answers)
    retries = sum(r.retries for r in rlm.client.ledger.records)
    return answered, retries, server.ask("stats")["requests"]


async def warm_up() -> None:
    """Import litellm before anything is timed (it takes seconds, once)."""
    from rlm_magic.llm.litellm_loader import load_litellm

    await load_litellm()


TOKEN_SERVERS = {
    "OpenAI's minute headers, retry-after in whole seconds": dict(
        header_style="openai", refusal_body="anthropic"
    ),
    "Anthropic's headers, retry-after as an HTTP date": dict(
        header_style="anthropic", retry_after="date", refusal_body="empty"
    ),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--code", help="a checkout whose rlm_magic is measured instead")
    parser.add_argument("--only", choices=["tokens", "closing"])
    parser.add_argument(
        "--litellm", action="store_true", help="token limits through litellm, not the wire"
    )
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT))  # tests.support.foreign_servers
    if args.code:
        sys.path.insert(0, str(Path(args.code).resolve()))
    import rlm_magic

    print(f"rlm_magic from {Path(rlm_magic.__file__).parent}; {args.reps} runs each\n")
    asyncio.run(warm_up())
    if args.only != "closing":
        through = "litellm" if args.litellm else "the wire transport"
        print(f"60 prompts of 2,000 tokens, 20,000 tokens/s, floor {FLOOR_S:.1f} s, {through}")
        for name, style in TOKEN_SERVERS.items():
            print(f"  {name}")
            for k in (0.5, 1.0, 2.0, 4.0):
                server = ServerProcess(dict(tokens_per_s=TOKENS_PER_S, latency_s=LATENCY, **style))
                runs = []
                for _ in range(args.reps):
                    time.sleep(1.5)  # the server's buckets fill up again
                    runs.append(asyncio.run(token_run(server, k, not args.litellm)))
                server.stop()
                walls = [w for w, _, _ in runs]
                print(
                    f"    k={k:<4} ratio {statistics.median(walls) / FLOOR_S:.2f}x (median; "
                    + " / ".join(f"{w / FLOOR_S:.2f}" for w in walls)
                    + ") | rejected "
                    + " / ".join(f"{r / PROMPTS:.0%}" for _, _, r in runs)
                    + " | failed "
                    + " / ".join(str(f) for _, f, _ in runs)
                )
    if args.only != "tokens":
        print("\n64 streamed prompts, 8 slots, every connection closed after its answer")
        for delay in (0, 20):
            server = ServerProcess(
                dict(
                    connection="close-after-answer",
                    close_delay_ms=delay,
                    slots=8,
                    latency_s=0.2,
                )
            )
            for wire in (True, False):
                runs = [asyncio.run(closing_run(server, wire)) for _ in range(args.reps)]
                print(
                    f"  closed {'at once' if not delay else f'{delay} ms later'}, "
                    f"{'wire' if wire else 'litellm'}: answers "
                    + " / ".join(f"{a}/64" for a, _, _ in runs)
                    + " | retries "
                    + " / ".join(str(r) for _, r, _ in runs)
                    + " | requests read "
                    + " / ".join(str(n) for _, _, n in runs)
                )
            server.stop()


if __name__ == "__main__":
    main()
