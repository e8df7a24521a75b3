"""A slow local model at the defaults: the eight-prompt batch of issue 20.

Run from the repo root:  python benchmarks/bench_local_servers.py [--scale 0.1]

The case: a llama.cpp server generating 20 tokens/s, eight prompts whose answers are
4,096 tokens each (~205 s each, all eight at once), ``RLM.timeout`` at its default of
120 s, ``max_retries`` at its default of 2. ``--scale`` shrinks every time in the case
alike (the rate is divided by it, the timeout multiplied), so the outcome is the same
and a run takes ``--scale`` of the time: ``--scale 1`` is the real thing (~3.5 min
streamed, ~6 min unstreamed). The server runs in this process: below ~0.25 its
chunks (and, with ``--litellm``, litellm's per-chunk work) take more CPU than two cores
give, and the streamed run's wall time grows past the answers' own time.

Two runs side by side, on the local test server of tests/llm_server.py:
- streamed (batch items stream, as they do now): ``timeout`` limits a stall, not the
  answer's length;
- unstreamed (``RLM.stream = False``, how batch items used to go): each attempt is cut
  at ``timeout`` and started again from zero.

Reported per run: answers that arrived, tokens the server generated against tokens
the answers hold (what was generated twice, or thrown away), the ledger's output
tokens, and wall time.
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
from rlm_magic.jupyter.helpers import NotebookHelpers as helpers  # noqa: E402
from tests.llm_server import FakeLLMServer  # noqa: E402

ANSWER_TOKENS = 4096
PROMPTS = 8


async def run(server: FakeLLMServer, scale: float, stream: bool, wire: bool) -> dict:
    server.reset()
    server.generation_rate = 20 / scale
    # Tokens that differ: litellm takes a chunk repeated 100 times for a stuck model.
    answer = "".join(f"t{i} " for i in range(ANSWER_TOKENS))
    server.reply_with("local-model", answer)
    server.usage = None  # counted by the server's tokenizer: one piece, one token
    server.chars_per_token = len(answer) / ANSWER_TOKENS
    rlm = RLM(
        model="openai/local-model",
        sub_model="openai/local-model",
        api_base=server.base_url,
        api_key="sk-local",
        progress=False,
        timeout=120 * scale,
        retry_backoff=0.5 * scale,
        stream=stream,
        wire_transport=wire,
    )
    started = time.perf_counter()
    answers = await helpers(rlm).llm_query_batch(
        [f"Summarise log part {i}" for i in range(PROMPTS)], return_exceptions=True
    )
    elapsed = time.perf_counter() - started
    whole = sum(isinstance(a, str) and len(a.split()) == ANSWER_TOKENS for a in answers)
    return {
        "answers": whole,
        "generated": server.tokens_generated,
        "kept": sum(len(a.split()) for a in answers if isinstance(a, str)),
        "ledger": rlm.usage().output_tokens,
        "elapsed": elapsed,
    }


async def main(scale: float, wire: bool) -> None:
    server = FakeLLMServer().start()
    try:
        from rlm_magic.llm.litellm_loader import load_litellm

        await load_litellm()
        print(
            f"{PROMPTS} prompts, {ANSWER_TOKENS:,}-token answers at 20 tokens/s, "
            f"timeout 120 s, max_retries 2; times scaled by {scale:g}; "
            f"{'wire' if wire else 'litellm'} transport"
        )
        print(
            f"{'':12} {'answers':>8} {'generated':>10} {'in answers':>11} "
            f"{'ledger out':>11} {'wall (s)':>9} {'unscaled':>9}"
        )
        for name, stream in (("streamed", True), ("unstreamed", False)):
            row = await run(server, scale, stream, wire)
            print(
                f"{name:12} {row['answers']:>5} / {PROMPTS} {row['generated']:>10,} "
                f"{row['kept']:>11,} {row['ledger']:>11,} {row['elapsed']:>9.1f} "
                f"{row['elapsed'] / scale:>9.0f}"
            )
    finally:
        server.stop()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--scale",
        type=float,
        default=0.25,
        help="every time of the case times this (1: the real case)",
    )
    parser.add_argument(
        "--litellm", action="store_true", help="send through litellm, not the wire transport"
    )
    args = parser.parse_args()
    asyncio.run(main(args.scale, not args.litellm))
