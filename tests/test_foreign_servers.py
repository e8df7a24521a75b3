"""The client against servers that are not ours (``foreign_servers``): token counts
0.5x-4x our estimate, limits announced per minute in OpenAI's or Anthropic's headers or
not at all, ``retry-after`` in whole seconds or as a date, 429 bodies of several
shapes, connections closed after each answer or when idle, requests queued behind a
few slots. Timing bounds here are generous (the ratios to the floor are measured side
by side in ``benchmarks/bench_foreign_servers.py``); counts are exact.
"""

from __future__ import annotations

import asyncio
import time

import pytest

from rlm_magic import RLM
from rlm_magic.llm.ratelimit import RateGate, read_headers

from .support import helpers
from .support.foreign_servers import Behaviour, ForeignServer, text_counting

LATENCY = 0.1
CONCURRENCY = 16


@pytest.fixture
def foreign(litellm_imported):
    """Start foreign servers for this test (``foreign(behaviour)``); all stopped after,
    and what this process learned about endpoints forgotten before and after."""
    from rlm_magic.llm import profiles

    started: list[ForeignServer] = []

    def start(behaviour: Behaviour) -> ForeignServer:
        started.append(ForeignServer(behaviour).start())
        return started[-1]

    profiles.forget()
    yield start
    for server in started:
        server.stop()
    profiles.forget()


def client_of(server: ForeignServer, **settings) -> RLM:
    return RLM(
        **{
            "model": "openai/foreign",
            "api_base": server.base_url,
            "api_key": "sk-test",
            "progress": False,
            "retry_backoff": 0.01,
            "max_concurrency": CONCURRENCY,
            **settings,
        }
    )


async def batch(rlm: RLM, prompts: list[str]) -> tuple[list, float]:
    started = time.perf_counter()
    answers = await helpers(rlm).llm_query_batch(prompts, return_exceptions=True)
    return answers, time.perf_counter() - started


def retries(rlm: RLM) -> int:
    return sum(r.retries for r in rlm.client.ledger.records)


# -- token limits, whatever the server counts ------------------------------------------------

# 30 prompts of 1,000 tokens (as the server counts them) against 10,000 tokens/s with a
# second's burst: the floor is (30,000 - 10,000) / 10,000 s + a latency.
PROMPTS, PROMPT_TOKENS, TOKENS_PER_S = 30, 1_000, 10_000
FLOOR_S = (PROMPTS * PROMPT_TOKENS - TOKENS_PER_S) / TOKENS_PER_S + LATENCY
# The first CONCURRENCY requests go out before anything is known: what the burst cannot
# hold of them is refused whatever the client does after.
BLIND_REFUSALS = (CONCURRENCY * PROMPT_TOKENS - TOKENS_PER_S) // PROMPT_TOKENS


def token_limited(**behaviour) -> Behaviour:
    return Behaviour(tokens_per_s=TOKENS_PER_S, latency_s=LATENCY, **behaviour)


def prompts_counted_at(k: float) -> list[str]:
    return [text_counting(k, PROMPT_TOKENS, f"p{i}") for i in range(PROMPTS)]


@pytest.mark.parametrize("k", [0.5, 1.0, 2.0, 4.0])
@pytest.mark.parametrize(
    "style",
    [
        dict(header_style="openai", retry_after="seconds", refusal_body="anthropic"),
        dict(header_style="anthropic", retry_after="date", refusal_body="empty"),
    ],
    ids=["openai-minute-headers", "anthropic-headers"],
)
async def test_a_token_limit_is_paced_near_its_floor_whatever_the_server_counts(foreign, k, style):
    server = foreign(token_limited(**style))
    rlm = client_of(server, max_retries=0)
    answers, wall = await batch(rlm, prompts_counted_at(k))
    assert not [a for a in answers if isinstance(a, BaseException)]
    assert server.stats.answered == PROMPTS
    # Beyond the blind first burst, next to no refusals: the gate counted as the server.
    assert server.stats.rejected <= BLIND_REFUSALS + 2
    assert wall <= 1.5 * FLOOR_S


@pytest.mark.parametrize(
    "style",
    [
        dict(header_style="openai", retry_after="date", refusal_body="plain"),
        dict(header_style="openai", retry_after="none", refusal_body="openai"),
        dict(header_style="anthropic", retry_after="seconds", refusal_body="anthropic"),
    ],
    ids=["date-plain", "no-retry-after", "anthropic-seconds"],
)
async def test_every_header_style_and_refusal_body_loses_nothing(foreign, style):
    server = foreign(token_limited(**style))
    rlm = client_of(server, max_retries=0)
    prompts = prompts_counted_at(2.0)
    answers, wall = await batch(rlm, prompts)
    assert answers == [f"ok: {p[:24]}" for p in prompts]
    assert server.stats.rejected <= BLIND_REFUSALS + 3
    assert wall <= 1.5 * FLOOR_S


async def test_a_server_without_rate_limit_headers_loses_nothing(foreign):
    server = foreign(token_limited(header_style="none", retry_after="seconds"))
    rlm = client_of(server, max_retries=0)
    answers, wall = await batch(rlm, prompts_counted_at(2.0))
    assert not [a for a in answers if isinstance(a, BaseException)]
    assert rlm.usage().total.rate_limited == server.stats.rejected
    assert wall <= 3 * FLOOR_S  # probed blind: slower, never stuck


def test_the_server_s_tokenizer_counts_k_times_our_estimate():
    from .support.foreign_servers import prompt_tokens

    for k in (0.5, 1.0, 2.0, 4.0):
        text = text_counting(k, 2_000, "p1")
        assert prompt_tokens({"messages": [{"content": text}]}) == 2_000
        assert 2_000 / (len(text) / 4) == pytest.approx(k, rel=0.02)


# -- what one refusal teaches the gate --------------------------------------------------------


def refusal_headers(remaining: int, retry_after: str = "1") -> dict[str, str]:
    """An OpenAI-style refusal from a server allowing 20,000 tokens/s (1.2M a minute)."""
    return {
        "x-ratelimit-limit-tokens": "1200000",
        "x-ratelimit-remaining-tokens": str(remaining),
        "x-ratelimit-reset-tokens": f"{(1_200_000 - remaining) / 20_000:.3f}s",
        "retry-after": retry_after,
    }


async def test_a_whole_second_retry_after_waits_one_request_s_refill_under_a_known_rate():
    gate = RateGate("m")
    tickets = [await gate.enter(500.0) for _ in range(16)]
    gate.rate_limited_by(tickets[-1], refusal_headers(1_180_000))
    # 500 tokens at 20,000/s: 25 ms, not the second the header rounded it up to.
    assert gate.paused_until - time.monotonic() < 0.1


async def test_refusals_before_any_answer_teach_the_server_s_count_from_its_budget():
    gate = RateGate("m")
    tickets = [await gate.enter(500.0) for _ in range(16)]
    # The server took 10 of them, counting 2,000 tokens each (4x our 500); six refused.
    for ticket in tickets[10:]:
        gate.rate_limited_by(ticket, refusal_headers(1_180_000))
    assert gate.count_ratio == pytest.approx(4.0, rel=0.1)


async def test_an_answer_s_usage_replaces_what_the_budget_suggested():
    gate = RateGate("m")
    tickets = [await gate.enter(500.0) for _ in range(4)]
    gate.rate_limited_by(tickets[-1], refusal_headers(1_194_000))
    gate.answered(tickets[0], None, 1_000, 2_000)
    assert gate.count_ratio == pytest.approx(2.0)


def test_anthropic_s_limits_are_paced_at_their_minute_rate_whatever_the_reset_says():
    reading = read_headers(
        {
            "anthropic-ratelimit-input-tokens-limit": "1200000",
            "anthropic-ratelimit-input-tokens-remaining": "1180000",
            "anthropic-ratelimit-input-tokens-reset": "2026-12-02T11:00:00Z",  # whole seconds
        }
    ).tokens
    assert reading.rate == 20_000


async def test_a_refund_made_void_by_a_pause_is_not_paid_back():
    gate = RateGate("m", tpm=1_200_000)
    ticket = await gate.enter(4_000.0)  # booked at our estimate; the server counts half
    gate.rate_limited_by(await gate.enter(1.0), {"retry-after": "1"})
    level = gate.tokens.level
    gate.answered(ticket, None, 2_000, 16_000)
    assert gate.tokens.level == level  # the pause emptied the bucket, that booking with it


# -- connections -------------------------------------------------------------------------------


@pytest.mark.parametrize("stream", [True, False], ids=["streamed", "whole"])
@pytest.mark.parametrize(
    "wire, close_delay_ms",
    [
        (True, 0),
        pytest.param(
            True,
            20,
            marks=pytest.mark.xfail(
                reason="known: under load the wire transport's free resend sometimes sends "
                "a prompt the server had already answered (65-67 answers for 64 prompts); "
                "a double-paid call, filed in issue 38's closing note",
                strict=False,
            ),
        ),
        pytest.param(
            False,
            20,
            marks=pytest.mark.xfail(
                reason="known: under load a connection closed a moment after its answer "
                "sometimes costs litellm a retry (1 in 64 seen once): filed in issue 38's "
                "closing note",
                strict=False,
            ),
        ),
    ],
    ids=["wire-at-once", "wire-a-moment-later", "litellm-a-moment-later"],
)
async def test_a_server_that_closes_every_connection_costs_no_retry(
    foreign, wire, stream, close_delay_ms
):
    # llama.cpp-like: 8 slots; each connection closed right after its answer (at once,
    # or a moment later, reading nothing meanwhile), keep-alive announced all the same.
    server = foreign(
        Behaviour(
            connection="close-after-answer",
            close_delay_ms=close_delay_ms,
            slots=8,
            latency_s=0.05,
            chunks=2,
        )
    )
    # (litellm's CPU per streamed chunk starves a loaded 2-core machine's loop past a
    # 2 s stall watch: a stall is not what this test is about.)
    timeout = 2 if wire else 10
    rlm = client_of(server, wire_transport=wire, stream=stream, timeout=timeout, max_retries=2)
    answers, _ = await batch(rlm, [f"prompt {i}" for i in range(64)])
    assert answers == [f"ok: prompt {i}" for i in range(64)]
    assert retries(rlm) == 0
    assert server.stats.answered == 64  # each prompt answered once
    assert server.stats.closed_after_answer == 64


@pytest.mark.parametrize("wire", [True, False], ids=["wire", "litellm"])
async def test_a_server_that_closes_idle_connections_costs_no_retry(foreign, wire):
    server = foreign(Behaviour(connection="close-idle", idle_close_ms=30, latency_s=0.01))
    rlm = client_of(server, wire_transport=wire, max_retries=2)
    for round_ in range(4):  # each round's connections idle past the server's limit
        answers, _ = await batch(rlm, [f"r{round_} {i}" for i in range(8)])
        assert answers == [f"ok: r{round_} {i}" for i in range(8)]
        await asyncio.sleep(0.03)
    assert retries(rlm) == 0


@pytest.mark.parametrize("stream", [True, False], ids=["streamed", "whole"])
async def test_requests_queued_behind_a_server_s_slots_are_all_answered_once(foreign, stream):
    server = foreign(Behaviour(slots=4, latency_s=0.1))
    rlm = client_of(server, stream=stream, timeout=2, max_retries=2)
    answers, _ = await batch(rlm, [f"q{i}" for i in range(32)])
    assert answers == [f"ok: q{i}" for i in range(32)]
    assert server.stats.peak_generating == 4
    assert (server.stats.answered, retries(rlm)) == (32, 0)
