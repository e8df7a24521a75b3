"""Streaming root turns, early block execution and prompt caching, on a 20-iteration
scripted RLM run whose replies are generated at a realistic rate.

Run from the repo root:  python benchmarks/bench_streaming.py [--iterations 20]
[--rate 50] [--sub 1.0] [--quick]

The root model (the local server of tests/support/llm_server.py, speaking Anthropic's Messages
API for ``anthropic/claude-sonnet-4-5``, so litellm prices it with Anthropic's cache
prices) writes each turn as: a line of prose, a ```repl block that fans out a 4-prompt
``llm_query_batch`` (``--sub`` seconds per sub-call), then a paragraph of prose after the
code. Every reply is generated at ``--rate`` tokens/s, streamed or not: unstreamed, the
whole answer arrives when the last token is made. The REPL prints a 2,000-character
slice each turn, so the conversation grows as a real one does.

Reported: wall time with streaming off, on, and on with early block execution; the
worst delay of a 10 ms heartbeat on the loop (CPU per chunk); and the input-token cost
of the run with and without prompt caching.
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
from rlm_magic.demo import split_tokens  # noqa: E402
from tests.support.llm_server import FakeLLMServer  # noqa: E402

MODEL = "anthropic/claude-sonnet-4-5"
SERVED = "claude-sonnet-4-5"
SUB = "sub-model"


def reply_for(turn: int, iterations: int) -> str:
    if turn >= iterations - 1:
        return "I have what I need.\nFINAL_VAR(summary)"
    after = " ".join(
        [
            f"Chunk {turn} looks consistent with the earlier ones, so next I "
            "check the following slice in the same way."
        ]
        * 3
    )
    return (
        f"Step {turn}: I read slice {turn} of the context and ask about its parts.\n"
        "```repl\n"
        f"part = context[{turn * 2000}:{(turn + 1) * 2000}]\n"
        f"answers = llm_query_batch([f'Summarise part {{i}} of slice {turn}' "
        "for i in range(4)])\n"
        "summary = ' / '.join(answers)\n"
        "print(part)\n"
        "```\n"
        f"{after}\n"
    )


def turn_of(body: dict) -> int:
    return sum(1 for m in body["messages"] if m["role"] == "assistant")


async def heartbeat(lags: list[float], period: float = 0.01) -> None:
    while True:
        before = time.perf_counter()
        await asyncio.sleep(period)
        lags.append(time.perf_counter() - before - period)


async def one_run(
    server: FakeLLMServer, iterations: int, rate: float, *, stream: bool, early: bool, caching: bool
):
    server.reset()
    server.usage = None  # ~4 characters a token, as the provider would count
    server.token_delay = 1 / rate
    server.model_latency = {SUB: args.sub}
    replies = {}

    def reply(body: dict) -> str:
        return replies.setdefault(turn_of(body), reply_for(turn_of(body), iterations))

    def generation_time(body: dict) -> float:
        if body.get("model") != SERVED or body.get("stream"):
            return server.model_latency.get(body.get("model"), 0.0)
        return len(split_tokens(reply(body))) / rate  # unstreamed: all at the end

    server.reply_with(SERVED, reply)
    server.latency_for = generation_time
    rlm = RLM(
        model=MODEL,
        sub_model=f"openai/{SUB}",
        api_base=server.anthropic_base,
        api_key="sk-bench",
        progress=False,
        stream=stream,
        early_execution=early,
        prompt_caching=caching,
        max_iterations=iterations + 2,
    )
    context = "".join(
        f"line {i}: some log text about service {i % 7}\n" for i in range(iterations * 60)
    )
    lags: list[float] = []
    beat = asyncio.ensure_future(heartbeat(lags))
    started = time.perf_counter()
    try:
        result = await rlm.arun("Summarise the log", context=context)
    finally:
        beat.cancel()
    wall = time.perf_counter() - started
    assert result.success and result.iterations == iterations, (result, result.error)
    usage = result.usage.by_model[MODEL]
    return wall, max(lags), usage, result


async def cpu_per_chunk(words: int = 2000) -> tuple[float, float, int]:
    """CPU seconds this process spends on one answer of ``words`` tokens, streamed and
    not, against a server in another process (so its CPU is not counted)."""
    import subprocess

    server = subprocess.Popen(
        [sys.executable, str(ROOT / "tests" / "llm_server.py")],
        stdout=subprocess.PIPE,
        stdin=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    try:
        base_url = server.stdout.readline().strip()
        rlm = RLM(model="openai/cpu", api_base=base_url, api_key="sk-bench", progress=False)
        prompt = " ".join(f"w{i}" for i in range(words))  # the server echoes it back
        seen = []
        results = {}
        for stream in (False, True, False, True):  # the first of each warms up
            before = time.process_time()
            await rlm.client.complete(
                [{"role": "user", "content": prompt}], stream=stream, on_text=seen.append
            )
            results[stream] = time.process_time() - before
        chunks = len(seen) // 2
        return results[False], results[True], chunks
    finally:
        server.kill()


def input_cost(litellm, usage) -> tuple[float, float]:
    """(input cost as billed, input cost had nothing been cached), in dollars."""
    info = litellm.get_model_info(MODEL)
    base = info["input_cost_per_token"]
    read = info.get("cache_read_input_token_cost", base)
    write = info.get("cache_creation_input_token_cost", base)
    plain = usage.input_tokens - usage.cached_input_tokens - usage.cache_write_tokens
    billed = plain * base + usage.cached_input_tokens * read + usage.cache_write_tokens * write
    return billed, usage.input_tokens * base


async def main() -> None:
    server = FakeLLMServer().start()  # sub-calls use its OpenAI-style route
    from rlm_magic.llm.litellm_loader import load_litellm

    litellm = await load_litellm()
    try:
        print(
            f"# {args.iterations}-iteration RLM run, replies generated at "
            f"{args.rate:g} tokens/s, sub-calls {args.sub:g} s\n"
        )
        info = litellm.get_model_info(MODEL)
        print(
            f"{MODEL} at litellm's prices: input ${info['input_cost_per_token'] * 1e6:.2f}"
            f"/M, cache read ${info['cache_read_input_token_cost'] * 1e6:.2f}/M, cache "
            f"write ${info['cache_creation_input_token_cost'] * 1e6:.2f}/M\n"
        )
        await one_run(server, 2, 1000, stream=True, early=False, caching=True)  # warm-up
        rows = []
        for label, stream, early, caching in (
            ("streaming off", False, False, True),
            ("streaming on", True, False, True),
            ("streaming on, early execution", True, True, True),
            ("streaming on, prompt caching off", True, False, False),
        ):
            wall, lag, usage, result = await one_run(
                server, args.iterations, args.rate, stream=stream, early=early, caching=caching
            )
            billed, uncached = input_cost(litellm, usage)
            early_blocks = sum(i.early_blocks for i in result.trajectory)
            rows.append((label, wall, lag, usage, billed, uncached, early_blocks))
        print(
            "| run | wall (s) | worst loop lag (ms) | blocks started early | input tokens "
            "| cached input | cache writes | input cost | cost of the run |"
        )
        print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
        for label, wall, lag, usage, billed, _uncached, early_blocks in rows:
            print(
                f"| {label} | {wall:.1f} | {lag * 1000:.0f} | {early_blocks} | "
                f"{usage.input_tokens:,} | {usage.cached_input_tokens:,} | "
                f"{usage.cache_write_tokens:,} | ${billed:.4f} | ${usage.cost_usd:.4f} |"
            )
        plain_cpu, stream_cpu, chunks = await cpu_per_chunk()
        print(
            f"\nCPU of one {chunks:,}-token answer in this process: {plain_cpu * 1000:.0f} ms "
            f"unstreamed, {stream_cpu * 1000:.0f} ms streamed: "
            f"{(stream_cpu - plain_cpu) / chunks * 1e6:.0f} us more per chunk."
        )
        cached, plain = rows[1], rows[3]
        print(
            f"\nPrompt caching: input cost ${cached[4]:.4f} against ${plain[4]:.4f} "
            f"uncached ({1 - cached[4] / plain[4]:.0%} less); the ledger says caching "
            f"saved ${cached[3].cache_saved_usd:.4f}."
        )
        off, on, early = rows[0][1], rows[1][1], rows[2][1]
        print(
            f"Early execution: {early:.1f} s against {on:.1f} s streamed "
            f"({1 - early / on:.0%} less); streaming alone: {on:.1f} s against "
            f"{off:.1f} s unstreamed."
        )
    finally:
        server.stop()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=20)
    parser.add_argument("--rate", type=float, default=50.0, help="tokens/s (50)")
    parser.add_argument("--sub", type=float, default=1.0, help="sub-call latency, s (1.0)")
    parser.add_argument("--quick", action="store_true", help="5 iterations")
    args = parser.parse_args()
    if args.quick:
        args.iterations = 5
    asyncio.run(main())
