"""Local servers as they behave: a slow model at the defaults (issue 20), a server's
slots (issue 28), and a real ``llama-server`` (issue 28).

Run from the repo root:
    python benchmarks/bench_local_servers.py [--scale 0.1]        # issue 20's case
    python benchmarks/bench_local_servers.py --slots [--scale 0.5]
    python benchmarks/bench_local_servers.py --url http://127.0.0.1:8080/v1

``--slots``: 64 prompts with answers of 128 tokens (20 tokens/s a slot, scaled) against
the test server serving 8 at once and queueing the rest, as llama.cpp's ``--parallel 8``
does; ``timeout=30`` (scaled), ``max_concurrency=64``; the calls held to the server's
slots (now) and not held (before: ``slots.held`` turned off). Reported: answers, stall
retries, the most requests the server queued, wall time.

``--url``: the same against a real llama.cpp server (``llama-server --parallel 8``; not
scaled; prompts that ask for long answers, ``max_tokens=128``), then typed answers (a
pydantic model, 8 prompts at the defaults: valid answers and requests sent), and what its
``/tokenize`` says of log text (characters per token, the first chunk advice and
``max_output_chars`` it gives on the server's window).

Issue 20's case:

The case: a llama.cpp server generating 20 tokens/s, eight prompts whose answers are
4,096 tokens each (~205 s each, all eight at once), ``RLM.timeout`` at its default of
120 s, ``max_retries`` at its default of 2. ``--scale`` shrinks every time in the case
alike (the rate is divided by it, the timeout multiplied), so the outcome is the same
and a run takes ``--scale`` of the time: ``--scale 1`` is the real thing (~3.5 min
streamed, ~6 min unstreamed). The server runs in this process: below ~0.25 its
chunks (and, with ``--litellm``, litellm's per-chunk work) take more CPU than two cores
give, and the streamed run's wall time grows past the answers' own time.

Two runs side by side, on the local test server of tests/support/llm_server.py:
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
from typing import Literal

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

from rlm_magic import RLM  # noqa: E402
from rlm_magic.jupyter.helpers import NotebookHelpers as helpers  # noqa: E402
from tests.support.llm_server import FakeLLMServer, _Discard  # noqa: E402

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


SLOT_PROMPTS = 64
SLOT_ANSWER_TOKENS = 128
SLOTS = 8


def _stall_retries(rlm: RLM) -> tuple[int, int]:
    """(retries, calls that failed) in the ledger."""
    usage = rlm.usage()
    return (
        sum(row.retries for row in usage.by_model.values()),
        sum(row.errors for row in usage.by_model.values()),
    )


RETRY_CAUSES: dict[str, int] = {}


def _count_retry_causes() -> None:
    """Every retry's cause, counted (the ledger counts retries, not why)."""
    from rlm_magic.llm import retries

    backoff = retries.backoff

    def counted(count, base_s, failure):
        cause = " ".join(f"{type(failure).__name__}: {failure}".split())[:90]
        RETRY_CAUSES[cause] = RETRY_CAUSES.get(cause, 0) + 1
        return backoff(count, base_s, failure)

    retries.backoff = counted


def _holding(held: bool) -> None:
    from rlm_magic.llm import client, slots

    client.slots = slots if held else _NotHeld()  # type: ignore[assignment]


class _NotHeld:
    """``slots`` as it was before: no hold, no question to the server."""

    @staticmethod
    def held(call, api_key=None):
        from rlm_magic.llm.slots import _NO_HOLD

        return _NO_HOLD


async def run_slots(
    server: FakeLLMServer | None, url: str | None, model: str, scale: float, held: bool
) -> dict:
    from rlm_magic.llm import profiles

    profiles.forget()
    _holding(held)
    if server is not None:
        server.reset()
        server.slots = SLOTS
        server.generation_rate = 20 / scale
        server.reply_with(
            model.split("/", 1)[1], " ".join(f"t{i}" for i in range(SLOT_ANSWER_TOKENS))
        )
        server.usage = None
        server.requests = _Discard()
    rlm = RLM(
        model=model,
        sub_model=model,
        api_base=url or server.base_url,
        api_key="sk-local",
        progress=False,
        timeout=30 * (scale if server is not None else 1.0),
        max_concurrency=64,
        max_tokens=SLOT_ANSWER_TOKENS,
    )
    prompts = [
        f"Write a long story about a lighthouse keeper number {i}. Use many words."
        for i in range(SLOT_PROMPTS)
    ]
    started = time.perf_counter()
    answers = await helpers(rlm).llm_query_batch(prompts, return_exceptions=True)
    elapsed = time.perf_counter() - started
    retries, failed = _stall_retries(rlm)
    if RETRY_CAUSES:
        print(f"  retried ({'held' if held else 'not held'}): {RETRY_CAUSES}")
        RETRY_CAUSES.clear()
    # Answered: whole, or stopped at max_tokens (not broken off by a stall or a failure).
    whole = sum(isinstance(a, str) and not getattr(a, "broken_off", False) for a in answers)
    _holding(True)
    return {
        "answers": whole,
        "retries": retries,
        "failed": failed,
        "queued": server.peak_queued if server is not None else None,
        "elapsed": elapsed,
    }


def _print_slot_rows(rows: list[tuple[str, dict]], scale: float) -> None:
    print(
        f"{'':12} {'answers':>8} {'stall retries':>14} {'failed':>7} {'queued at server':>17} "
        f"{'wall (s)':>9}"
    )
    for name, row in rows:
        queued = "-" if row["queued"] is None else str(row["queued"])
        print(
            f"{name:12} {row['answers']:>4} / {SLOT_PROMPTS} {row['retries']:>14} "
            f"{row['failed']:>7} {queued:>17} {row['elapsed']:>9.1f}"
        )


async def main_slots(scale: float) -> None:
    server = FakeLLMServer().start()
    try:
        print(
            f"{SLOT_PROMPTS} prompts, {SLOT_ANSWER_TOKENS}-token answers at 20 tokens/s a slot, "
            f"{SLOTS} slots (the rest queued at the server), timeout 30 s, max_concurrency 64; "
            f"times scaled by {scale:g}"
        )
        rows = []
        for name, held in (("held (now)", True), ("not held", False)):
            rows.append((name, await run_slots(server, None, "openai/local-model", scale, held)))
        _print_slot_rows(rows, scale)
    finally:
        server.stop()


async def main_real(url: str, model: str, only: str | None = None) -> None:
    from pydantic import BaseModel

    from rlm_magic.llm import local_servers, profiles, windows
    from rlm_magic.llm.windows import answer_room
    from rlm_magic.rlm.prompts import chunk_advice, context_sample, output_chars

    class Review(BaseModel):
        sentiment: Literal["positive", "negative"]
        score: int

    print(f"llama-server at {url}, model {model}")
    # -- what its probe and /tokenize say ----------------------------------------------
    profiles.forget()
    rlm = RLM(model=model, sub_model=model, api_base=url, api_key="sk-local", progress=False)
    log = "".join(
        f"2024-05-{1 + i % 28:02d} 12:{i % 60:02d}:{(7 * i) % 60:02d} "
        f"{['INFO', 'WARN', 'ERROR'][i % 3]} svc-{i % 7}[{1000 + i}]: "
        f"request id=0x{i * 2654435761 % 2**32:08x} took {i % 250} ms\n"
        for i in range(400)
    )
    await rlm.client.look_up_windows(model, sample=context_sample(log))
    window = rlm.client.input_window(model, advice=True)
    at = profiles.PROFILES.known_at(url, model)
    per_token = windows.chars_per_token(model)
    print(
        f"probe: {local_servers.server_kind(url, model)}, window {window}, "
        f"slots {at.server_slots if at else None}; log text at {per_token:.2f} characters "
        "a token by its /tokenize"
    )
    if window:
        room = window - answer_room(window, rlm.max_tokens, model)
        print(
            f"first chunk advice: at 4.00 {chunk_advice(room, 4.0)}; "
            f"at {per_token:.2f} {chunk_advice(room, per_token)}"
        )
        print(
            f"max_output_chars: {output_chars(rlm.max_output_chars, False, window, per_token):,} "
            f"(default {rlm.max_output_chars:,})"
        )
    # -- typed answers at the defaults ---------------------------------------------------
    if only == "held":
        return await _real_slots(url, model, (True,))
    if only not in (None, "typed"):
        return await _real_slots(url, model)
    profiles.forget()
    rlm = RLM(model=model, sub_model=model, api_base=url, api_key="sk-local", progress=False)
    started = time.perf_counter()
    answers = await helpers(rlm).llm_query_batch(
        [
            f"Review {i}: the coffee machine number {i} {'works well' if i % 2 else 'broke'}."
            for i in range(8)
        ],
        response_format=Review,
        return_exceptions=True,
    )
    usage = rlm.usage()
    sent = sum(row.calls + row.retries for row in usage.by_model.values())
    typed = sum(isinstance(a, Review) for a in answers)
    print(f"typed answers: {typed}/8 valid, {sent} requests, {time.perf_counter() - started:.1f}s")
    if only is None:
        await _real_slots(url, model)


async def _real_slots(url: str, model: str, which: tuple[bool, ...] = (True, False)) -> None:
    print(
        f"{SLOT_PROMPTS} prompts, max_tokens {SLOT_ANSWER_TOKENS}, timeout 30 s, max_concurrency 64"
    )
    for held in which:
        name = "held (now)" if held else "not held"
        _print_slot_rows([(name, await run_slots(None, url, model, 1.0, held))], 1.0)


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
    parser.add_argument("--slots", action="store_true", help="64 prompts against 8 slots")
    parser.add_argument("--url", help="a real llama-server's api_base (…/v1)")
    parser.add_argument("--model", default="openai/gemma", help="its model, as rlm-magic names it")
    parser.add_argument(
        "--only", choices=["typed", "slots", "held"], help="with --url: only this part"
    )
    args = parser.parse_args()
    _count_retry_causes()
    if args.url:
        asyncio.run(main_real(args.url, args.model, args.only))
    elif args.slots:
        asyncio.run(main_slots(args.scale if args.scale != 0.25 else 0.5))
    else:
        asyncio.run(main(args.scale, not args.litellm))
