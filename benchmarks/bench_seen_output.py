"""What stopping a root turn at a guess of its code's output saves.

Run from the repo root:  python benchmarks/bench_seen_output.py [--rate 50]

The root model (tests/support/llm_server.py) writes the reply Claude 4.6 wrote in the official
RLM library's report (alexzhang13/rlm PR 127), in the same shape: a ```repl block that
lists the top customers, then an "Output:" with a made-up table of names and totals,
prose built on it, and FINAL. Its next reply answers from the real output. Replies are
generated at ``--rate`` tokens/s (the server's tokenizer: about 4 characters a token).

Reported, streamed (the turn is stopped at "Output:") and unstreamed (the whole reply is
generated, then read up to the guess): the run's output tokens (both turns), the tokens
the server generated, and the run's wall time. Either way the guessed answer is not taken.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

from rlm_magic import RLM  # noqa: E402
from tests.support.llm_server import FakeLLMServer  # noqa: E402

CONTEXT = "\n".join(f"order {i}, customer C{i % 37:02d}, total {i * 7 % 500}" for i in range(2000))
NAMES = ["Acme Corp", "Globex", "Initech", "Umbrella", "Hooli", "Stark Ind.", "Wayne Ent."]
GUESS = "".join(f"| {n} | {9000 - 700 * i:,} | {40 - 3 * i} |\n" for i, n in enumerate(NAMES))
REPLY = (
    "I'll total the orders per customer and list the top ones.\n"
    "```repl\n"
    "import collections, re\n"
    "totals = collections.Counter()\n"
    "for line in context.splitlines():\n"
    "    m = re.search(r'customer (\\w+), total (\\d+)', line)\n"
    "    totals[m.group(1)] += int(m.group(2))\n"
    "top = totals.most_common(7)\n"
    "print(top)\n"
    "```\n"
    "Output:\n"
    "```\n| customer | total | orders |\n|---|---|---|\n" + GUESS + "```\n"
    "The top customer is Acme Corp with 9,000 in total, well ahead of Globex; the top "
    "three together make up about a third of all revenue, and the tail is flat.\n\n"
    "FINAL(The top customers are Acme Corp (9,000), Globex (8,300) and Initech (7,600).)"
)
ANSWER = "FINAL_VAR(top)"


async def one_run(server: FakeLLMServer, stream: bool) -> dict[str, float]:
    server.reset()
    server.usage = None  # count tokens as the server's tokenizer does
    server.generation_rate = RATE
    server.script("root-model", [REPLY, ANSWER])
    rlm = RLM(
        model="openai/root-model",
        sub_model="openai/sub-model",
        api_base=server.base_url,
        api_key="sk-bench",
        progress=False,
        stream=stream,
        sandbox="none",
    )
    started = time.perf_counter()
    result = await rlm.arun("Who are the top customers?", context=CONTEXT)
    assert result.success and "C" in (result.final_answer or ""), result
    assert "Acme" not in (result.final_answer or "")  # the guessed answer was not taken
    return {
        "output tokens (run)": result.usage.total.output_tokens,
        "tokens generated (server)": server.tokens_generated,
        "wall s": time.perf_counter() - started,
    }


async def main() -> None:
    server = FakeLLMServer().start()
    try:
        await one_run(server, True)  # litellm's import and first call, not measured
        rows = {"streamed (stopped)": await one_run(server, True)}
        rows["unstreamed (whole)"] = await one_run(server, False)
    finally:
        server.stop()
    print(
        f"reply: {len(REPLY):,} characters, the guess from 'Output:' on "
        f"{len(REPLY) - REPLY.index('Output:'):,}; generated at {RATE:g} tokens/s"
    )
    for name, row in rows.items():
        print(
            f"{name:20} "
            + "  ".join(
                f"{k}: {v:,.2f}" if isinstance(v, float) else f"{k}: {v:,}" for k, v in row.items()
            )
        )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=float, default=50.0, help="tokens/s the model writes")
    RATE = parser.parse_args().rate
    asyncio.run(main())
