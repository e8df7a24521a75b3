"""Provider rate limits: no item is lost to a 429, everybody pauses together, and
requests are paced to what the provider allows.

The local server enforces its limits as token buckets and answers excess requests at
once with 429 plus ``retry-after`` and OpenAI's ``x-ratelimit-*`` headers (or, where a
test says so, with fewer headers or none).
"""

from __future__ import annotations

import asyncio
import time

import pytest

from rlm_magic import LLMQueryError
from rlm_magic.jupyter.progress import BatchProgress
from rlm_magic.llm.ratelimit import RateGate, parse_duration, read_headers

from .support import helpers, make_rlm


async def test_a_batch_over_the_request_limit_loses_no_item(server):
    rlm = make_rlm(server, max_concurrency=32, max_retries=0)
    server.latency = 0.05
    server.limit_rate(rps=40, burst=10)
    answers = await helpers(rlm).llm_query_batch([f"p{i}" for i in range(80)])
    assert answers == [f"echo: p{i}" for i in range(80)]
    # The first 32 go out before anything is known and 22 of them are turned away;
    # after that, pacing keeps rejections rare.
    assert server.rejected <= 22 + 8
    usage = rlm.usage()
    assert usage.total.rate_limited == server.rejected and usage.total.errors == 0
    assert usage.total.retries == 0  # waiting out a rate limit is not a retry


async def test_a_batch_over_the_token_limit_loses_no_item(server):
    rlm = make_rlm(server, max_retries=0)
    server.usage = None  # report prompt tokens as the limit counts them
    server.limit_rate(tps=2000, token_burst=2000)
    prompts = [f"{i:03d} " + "x" * 996 for i in range(16)]  # 250 tokens each
    started = time.perf_counter()
    answers = await helpers(rlm).llm_query_batch(prompts)
    assert answers == [f"echo: {p}" for p in prompts]
    # 4,000 tokens against 2,000 at once and 2,000/s: about a second, paced.
    assert 0.8 < time.perf_counter() - started < 10
    assert server.rejected <= 8


async def test_a_server_that_sends_no_headers_loses_no_item(server):
    rlm = make_rlm(server, max_concurrency=32, max_retries=0)
    server.limit_rate(rps=50, burst=10, headers="none")
    answers = await helpers(rlm).llm_query_batch([f"p{i}" for i in range(60)])
    assert answers == [f"echo: p{i}" for i in range(60)]
    assert rlm.usage().total.rate_limited == server.rejected > 0


async def test_one_429_pauses_new_calls_to_that_endpoint_until_retry_after(server):
    notebook, run = make_rlm(server), make_rlm(server)  # two users of one endpoint
    server.fail("429", match="first", headers={"retry-after-ms": "800"})
    first = asyncio.ensure_future(helpers(notebook).llm_query("first"))
    assert await asyncio.to_thread(server.wait_for, lambda: server.rejected_at)
    limited_at = server.rejected_at[0]
    # Once the client has read the 429 (the server sent it; a busy loop reads it later).
    gate = notebook.client.gate(notebook.sub_model)
    assert await asyncio.to_thread(server.wait_for, lambda: gate.paused_until > 0, 10)
    assert await helpers(run).llm_query("second") == "echo: second"
    assert await first == "echo: first"
    second_arrived = server.arrivals[server.index_of("second")]
    assert second_arrived - limited_at >= 0.75  # held back for the server's 800 ms


async def test_a_pause_leaves_other_models_alone(server):
    rlm = make_rlm(server)
    server.fail("429", model="sub-model", headers={"retry-after-ms": "3000"})
    paused = asyncio.ensure_future(helpers(rlm).llm_query("held"))
    assert await asyncio.to_thread(server.wait_for, lambda: server.rejected_at)
    started = time.perf_counter()
    assert await helpers(rlm).llm_query("free", model="openai/other") == "echo: free"
    assert time.perf_counter() - started < 1.5
    paused.cancel()


async def test_requests_in_flight_during_a_pause_are_left_alone(server):
    rlm = make_rlm(server, max_concurrency=8)
    server.latency = 0.5
    server.fail("429", match="p0", headers={"retry-after-ms": "1000"})
    answers = await helpers(rlm).llm_query_batch([f"p{i}" for i in range(8)])
    assert answers == [f"echo: p{i}" for i in range(8)]
    # Seven went out with p0 and were answered; only p0 was sent again.
    assert len(server.requests) == 9 and server.cancelled == 0


async def test_an_interrupt_during_a_pause_stops_at_once(server):
    rlm = make_rlm(server)
    server.fail("429", times=100, headers={"retry-after": "30"})
    task = asyncio.ensure_future(helpers(rlm).llm_query_batch(["a", "b", "c"]))
    assert await asyncio.to_thread(server.wait_for, lambda: server.rejected_at)
    await asyncio.sleep(0.05)  # now waiting out the 30 s pause
    started = time.perf_counter()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert time.perf_counter() - started < 0.5
    assert server.in_flight == 0
    records = rlm.client.ledger.records
    assert [r.error for r in records] == ["cancelled"] * 3
    assert sum(r.rate_limited for r in records) >= 1


async def test_rate_limit_wait_bounds_how_long_an_item_waits(server):
    rlm = make_rlm(server, rate_limit_wait=1.0)
    server.fail("429", times=1000, headers={"retry-after-ms": "200"})
    started = time.perf_counter()
    with pytest.raises(LLMQueryError, match=r"rate limited for 1s .*rate_limit_wait=1s"):
        await helpers(rlm).llm_query("x")
    assert time.perf_counter() - started < 2.5
    [record] = rlm.client.ledger.records
    assert record.rate_limited >= 3 and record.retries == 0


async def test_a_retry_after_past_rate_limit_wait_fails_now_not_later(server):
    rlm = make_rlm(server, rate_limit_wait=5.0)
    server.fail("429", times=1, headers={"retry-after": "3600"})
    started = time.perf_counter()
    with pytest.raises(LLMQueryError, match="would hold it 3600s more"):
        await helpers(rlm).llm_query("x")
    assert time.perf_counter() - started < 1.0
    assert len(server.requests) == 1


async def test_explicit_rpm_paces_from_the_first_request(server):
    rlm = make_rlm(server, rpm=600, max_concurrency=64)  # 10 requests a second
    await helpers(rlm).llm_query_batch([f"p{i}" for i in range(25)])
    spread = server.arrivals[-1] - server.arrivals[0]
    # A burst of one second's worth, then one every 0.1 s: 15 more take 1.4 s or so.
    assert 1.2 < spread < 5
    assert server.rejected == 0


async def test_cancelled_waiters_give_their_turns_back(server):
    rlm = make_rlm(server, rpm=60, max_concurrency=64)  # one request a second
    held = asyncio.ensure_future(helpers(rlm).llm_query_batch([f"p{i}" for i in range(50)]))
    assert await asyncio.to_thread(server.wait_for, lambda: len(server.requests) == 1)
    held.cancel()  # 49 calls booked up to 49 s ahead give up
    with pytest.raises(asyncio.CancelledError):
        await held
    await asyncio.sleep(1.1)  # the next turn of the pace
    started = time.perf_counter()
    assert await helpers(rlm).llm_query("next") == "echo: next"
    assert time.perf_counter() - started < 1.5


async def test_learned_limits_pace_the_next_batch_without_any_429(server):
    rlm = make_rlm(server, max_concurrency=64)
    server.limit_rate(rps=50, burst=20)
    await helpers(rlm).llm_query_batch([f"a{i}" for i in range(40)])
    await asyncio.sleep(0.5)  # the server's bucket refills
    rejected, sent = server.rejected, len(server.requests)
    pacer = rlm.client.gate().requests
    learned = (pacer.rate, pacer.capacity, pacer.distrusted, pacer.contradictions)
    await helpers(rlm).llm_query_batch([f"b{i}" for i in range(40)])
    # (It failed once in 5 runs on a loaded machine with 7 429s, not reproduced in 60
    # runs under CPU hogs and loop stalls: 0-1 each. Should it fail again, say why.)
    requests = server.requests[sent:]
    others = sum(not r["messages"][-1]["content"].startswith("b") for r in requests)
    assert server.rejected - rejected <= 2, (
        f"learned (rate, capacity, distrusted, contradictions) = {learned}, after the "
        f"batch: {(pacer.rate, pacer.capacity, pacer.distrusted, pacer.contradictions)}; "
        f"requests during it: {len(requests)}, of others than this batch's: {others}"
    )


async def test_a_run_s_root_and_sub_calls_wait_out_rate_limits(server):
    rlm = make_rlm(server, max_retries=0)
    server.fail("429", times=2, model="root-model", headers={"retry-after-ms": "50"})
    server.fail("429", times=3, model="sub-model", headers={"retry-after-ms": "50"})
    server.script(
        "root-model",
        [
            "```repl\nanswers = llm_query_batch(['a', 'b', 'c'])\nprint(answers)\n```",
            "FINAL_VAR(answers)",
        ],
    )
    result = await rlm.arun("q", context="ctx")
    assert result.success and result.final_answer == str(["echo: a", "echo: b", "echo: c"])
    assert result.usage.total.rate_limited == 5
    assert result.usage.total.errors == 0


def test_the_progress_line_says_when_a_batch_is_held_back():
    gate = RateGate("openai/x")
    gate.paused_until = time.monotonic() + 2.5
    progress = BatchProgress(10, enabled=False, hold=gate.hold_message)
    assert "rate limited: resuming in 3 s" in progress.line()
    gate.paused_until = 0
    assert "rate limited" not in progress.line()


async def test_usage_shows_rate_limited_responses_only_once_there_are_some(server):
    rlm = make_rlm(server)
    await helpers(rlm).llm_query("x")
    assert "rate limited" not in repr(rlm.usage())
    server.fail("429", headers={"retry-after-ms": "10"})
    await helpers(rlm).llm_query("y")
    table = repr(rlm.usage())
    assert "rate limited" in table.splitlines()[0]
    assert table.splitlines()[-1].split()[-1] == "1"


# -- reading the provider's headers ------------------------------------------------------


@pytest.mark.parametrize(
    "text, seconds",
    [
        ("1s", 1.0),
        ("6m0s", 360.0),
        ("120ms", 0.12),
        ("1h2m3s", 3723.0),
        ("0.5", 0.5),
        ("17", 17.0),
        ("soon", None),
        (None, None),
    ],
)
def test_reset_durations_in_openai_s_spelling(text, seconds):
    assert (
        parse_duration(text) == pytest.approx(seconds)
        if seconds is not None
        else parse_duration(text) is None
    )


def test_headers_through_litellm_s_prefix_and_anthropic_s_spelling():
    openai = read_headers(
        {
            "llm_provider-x-ratelimit-limit-requests": "500",
            "x-ratelimit-remaining-requests": "100",
            "llm_provider-x-ratelimit-reset-requests": "48s",
            "retry-after-ms": "250",
        }
    )
    assert openai.requests.limit == 500 and openai.requests.remaining == 100
    assert openai.requests.rate == pytest.approx(399.5 / 48)  # about 500 a minute
    assert openai.retry_after_s == 0.25
    anthropic = read_headers(
        {
            "anthropic-ratelimit-input-tokens-limit": "40000",
            "anthropic-ratelimit-input-tokens-remaining": "1000",
            "retry-after": "7",
        }
    )
    assert anthropic.tokens.limit == 40000 and anthropic.tokens.remaining == 1000
    assert anthropic.retry_after_s == 7
    assert not read_headers({"content-type": "json"}).any_limits


def test_every_answer_s_own_figures_are_read_under_the_same_header_names():
    from multidict import CIMultiDict, CIMultiDictProxy

    def answer(remaining: str, reset: str) -> CIMultiDictProxy:  # as aiohttp gives them
        return CIMultiDictProxy(
            CIMultiDict(
                {
                    "Content-Type": "application/json",
                    "X-RateLimit-Limit-Tokens": "1200000",
                    "X-RateLimit-Remaining-Tokens": remaining,
                    "X-RateLimit-Reset-Tokens": reset,
                }
            )
        )

    first, second = read_headers(answer("1190000", "500ms")), read_headers(answer("1150000", "2s"))
    assert (first.tokens.remaining, first.tokens.reset_s) == (1190000, 0.5)
    assert (second.tokens.remaining, second.tokens.reset_s) == (1150000, 2.0)
    assert not read_headers(CIMultiDictProxy(CIMultiDict({"Server": "vllm"}))).any_limits


async def test_a_gate_is_named_by_its_key_s_hash_never_the_key():
    from rlm_magic.llm.ratelimit import gate_for

    one, other = "sk-one-" + "a" * 40, "sk-other-" + "b" * 40
    first = gate_for("openai/keyed", None, one)
    assert gate_for("openai/keyed", None, one) is first  # found again, not made again
    assert gate_for("openai/keyed", None, other) is not first  # another account's limits
    from rlm_magic.llm.profiles import PROFILES

    listed = repr(PROFILES.gates[asyncio.get_running_loop()])
    assert "openai/keyed" in listed and one not in listed and other not in listed


def test_a_nearly_full_bucket_teaches_no_rate():
    reading = read_headers(
        {
            "x-ratelimit-limit-requests": "500",
            "x-ratelimit-remaining-requests": "499",
            "x-ratelimit-reset-requests": "120ms",
        }
    ).requests
    assert reading.rate is None  # one unit of rounding would make it 2x off


# -- quantized limits: the headers announce the minute, a small bucket is enforced ------------


async def test_a_quantized_request_limit_is_paced_by_what_the_server_accepts(server):
    rlm = make_rlm(server, max_concurrency=32, max_retries=0)
    server.limit_rate(rps=50, burst=10, announce_rpm=3000)
    answers = await helpers(rlm).llm_query_batch([f"p{i}" for i in range(80)])
    assert answers == [f"echo: p{i}" for i in range(80)]
    # 22 of the first 32 are turned away before anything is known; trusting the
    # announced 3,000/min would then draw a 429 for nearly every request.
    assert server.rejected <= 22 + 12
    gate = rlm.client.gate()
    assert gate.requests.distrusted and gate.requests.rate <= 55
    assert gate.requests.header_rate > 1000  # the headers' word: a ceiling only


async def test_a_quantized_token_limit_is_paced_by_what_the_server_accepts(server):
    rlm = make_rlm(server, max_retries=0)
    server.usage = None
    server.limit_rate(tps=4000, token_burst=4000, announce_tpm=1_000_000)
    prompts = [f"{i:03d} " + "x" * 1996 for i in range(24)]  # 500 tokens each
    answers = await helpers(rlm).llm_query_batch(prompts)
    assert answers == [f"echo: {p}" for p in prompts]
    # 8 of the first 16 before anything is known, and a few while the pace settles (more
    # on a loaded machine); trusting the announced budget would draw one per request.
    assert server.rejected <= 8 + 10
    assert rlm.client.gate().tokens.distrusted


def test_a_429_whose_retry_after_belies_the_headers_is_believed_at_once():
    from rlm_magic.llm.ratelimit import Ticket

    gate = RateGate("openai/q")
    quantized = {
        "x-ratelimit-limit-requests": "3000",
        "x-ratelimit-remaining-requests": "0",
        "x-ratelimit-reset-requests": "1s",
        "retry-after-ms": "20",
    }
    gate.rate_limited_by(Ticket(1.0, time.monotonic()), quantized)
    assert gate.requests.distrusted
    assert 40 <= gate.requests.rate <= 50  # one request per 20 ms, less a margin
    # Answers that repeat the minute's budget do not raise the pace back to it.
    gate.answered(
        Ticket(1.0, time.monotonic()),
        {**quantized, "retry-after-ms": None, "x-ratelimit-remaining-requests": "10"},
        None,
        0,
    )
    assert gate.requests.rate <= 51


def test_honest_headers_are_still_believed():
    from rlm_magic.llm.ratelimit import Ticket

    gate = RateGate("openai/h")
    honest = {
        "x-ratelimit-limit-requests": "50",
        "x-ratelimit-remaining-requests": "0",
        "x-ratelimit-reset-requests": "1s",
        "retry-after-ms": "20",
    }
    gate.rate_limited_by(Ticket(1.0, time.monotonic()), honest)
    assert not gate.requests.distrusted
    assert gate.requests.rate == pytest.approx(49.5)


# -- token limits: paced at the rate the server accepts, counted as the server counts ----


async def test_a_token_limited_batch_runs_near_its_floor_at_a_long_latency(server):
    rlm = make_rlm(server, max_retries=0)  # the default concurrency, 16
    server.usage = None
    server.latency = 1.5  # 8 requests a second need 12 in flight to keep the pace
    server.limit_rate_per_minute(rps=100, tps=4000, token_burst=4000)  # OpenAI's headers
    prompts = [f"{i:03d} " + "x" * 1996 for i in range(32)]  # 500 tokens each
    started = time.perf_counter()
    answers = await helpers(rlm).llm_query_batch(prompts)
    wall = time.perf_counter() - started
    assert answers == [f"echo: {p}" for p in prompts]
    # The burst at once, the other 12,000 tokens at 4,000/s, then the last answer: 4.5 s.
    # Halving the requests in flight on the first 429 took 7.5 s.
    floor = 12_000 / 4000 + 1.5
    assert wall < 1.3 * floor
    assert server.rejected <= 8 + 3  # 8 of the first 16, sent before anything was known


async def test_a_429_leaves_as_many_requests_in_flight_as_a_known_token_rate_needs():
    gate = RateGate("openai/tokens")
    tickets = [await gate.enter(2000.0) for _ in range(16)]  # nothing known: all at once
    spent = {
        "x-ratelimit-limit-tokens": "1200000",  # the minute's budget, as OpenAI's say
        "x-ratelimit-remaining-tokens": "1180000",
        "x-ratelimit-reset-tokens": "1s",  # 20,000 tokens a second
        "retry-after-ms": "100",
    }
    gate.rate_limited_by(tickets[-1], spent)
    assert gate.tokens.rate == pytest.approx(20_000, rel=0.01)
    assert gate.cap is not None and gate.cap >= 15  # pacing answers it, not the cap
    # An answer after 2 s: 10 requests a second then need about 20 in flight.
    tickets[0].sent_at -= 2.0
    gate.answered(tickets[0], spent, 2000, 8000)
    assert gate.cap >= 20


async def test_prompts_are_booked_as_the_server_counts_them():
    gate = RateGate("openai/tokenizer")
    first = await gate.enter(2000.0)  # our estimate: 4 characters a token
    gate.answered(first, None, 3000, 8000)  # the server counted 1.5 times as many
    assert gate.count_ratio == pytest.approx(1.5)
    assert (await gate.enter(2000.0)).tokens == pytest.approx(3000)
    # A usage figure that cannot be this prompt's count (a fixed one) teaches nothing.
    gate.answered(await gate.enter(2000.0), None, 10, 8000)
    assert gate.count_ratio == pytest.approx(1.5)


async def test_a_server_counting_more_tokens_than_our_estimate_is_paced_by_its_count(server):
    rlm = make_rlm(server, max_retries=0)
    server.usage = None  # usage reports the server's own count
    server.latency = 1.0  # a second of booking by our own estimate before usage comes
    server.limit_rate_per_minute(tps=4000, token_burst=4000, token_factor=1.5)
    prompts = [f"{i:03d} " + "x" * 1996 for i in range(24)]  # 500 of our tokens, 750 its
    started = time.perf_counter()
    answers = await helpers(rlm).llm_query_batch(prompts)
    wall = time.perf_counter() - started
    assert answers == [f"echo: {p}" for p in prompts]
    gate = rlm.client.gate()
    assert gate.count_ratio == pytest.approx(1.5, rel=0.05)
    # Our miscount was not taken for a limit stricter than the headers say.
    assert not gate.tokens.distrusted
    assert gate.tokens.rate == pytest.approx(4000, rel=0.1)
    floor = (24 * 750 - 4000) / 4000 + 1.0  # 4.5 s
    assert wall < 1.3 * floor
    # 11 of the first 16 go before anything is known, a few more before the first answer.
    assert server.rejected <= 11 + 4


@pytest.mark.parametrize("count_known", [False, True])
def test_429s_before_the_server_s_count_is_known_do_not_discredit_its_headers(count_known):
    from rlm_magic.llm.ratelimit import Ticket

    gate = RateGate("openai/miscounted")
    honest = {
        "x-ratelimit-limit-tokens": "20000",
        "x-ratelimit-remaining-tokens": "0",
        "x-ratelimit-reset-tokens": "1s",  # 20,000 tokens a second
        "retry-after-ms": "100",  # what that rate says: no quantized limit in sight
    }
    gate.answered(Ticket(2000.0, time.monotonic()), {**honest, "retry-after-ms": None}, None, 0)
    for later in (1.0, 2.0, 3.0):  # three refusals, each sent after the headers were read
        sent = Ticket(2000.0, time.monotonic() + later, counted=count_known)
        gate.rate_limited_by(sent, honest)
    # Booked by our own estimate, the refusals may be our miscount (the server's
    # tokenizer counts more): the headers' rate stands. Counted as the server counts,
    # refusals at that rate say the limit is stricter than its headers.
    assert gate.tokens.distrusted == count_known


def test_a_429_that_came_a_moment_early_is_no_evidence_against_the_rate():
    from rlm_magic.llm.ratelimit import Ticket

    gate = RateGate("openai/race")
    honest = {
        "x-ratelimit-limit-tokens": "20000",
        "x-ratelimit-remaining-tokens": "0",
        "x-ratelimit-reset-tokens": "1s",
    }
    gate.answered(Ticket(2000.0, time.monotonic()), honest, None, 0)
    for later in (1.0, 2.0, 3.0):
        # 5 ms of refill short, of the 100 ms a request's tokens take: its send raced
        # the one before it, the pace was right.
        early = {**honest, "retry-after-ms": "5"}
        gate.rate_limited_by(Ticket(2000.0, time.monotonic() + later), early)
    assert not gate.tokens.distrusted
    assert gate.tokens.rate == pytest.approx(20_000, rel=0.01)


def test_a_refusal_with_room_left_in_the_announced_budget_shows_a_smaller_burst():
    from rlm_magic.llm.ratelimit import Ticket

    gate = RateGate("openai/minute")
    minute = {
        "x-ratelimit-limit-tokens": "1200000",  # the minute's budget ...
        "x-ratelimit-remaining-tokens": "1180000",  # ... with room for this request
        "x-ratelimit-reset-tokens": "1s",
        "retry-after-ms": "50",
    }
    gate.rate_limited_by(Ticket(2000.0, time.monotonic()), minute)
    assert gate.tokens.rate == pytest.approx(20_000, rel=0.01)  # the rate was right
    assert gate.tokens.capacity == pytest.approx(20_000, rel=0.01)  # a second's worth
    # Answers that announce the minute's budget again do not widen the burst.
    gate.answered(Ticket(2000.0, time.monotonic()), {**minute, "retry-after-ms": None}, None, 0)
    assert gate.tokens.capacity == pytest.approx(20_000, rel=0.01)
    assert not gate.tokens.distrusted


async def test_the_next_batch_under_a_minute_s_budget_bursts_no_more_than_is_enforced(server):
    rlm = make_rlm(server, max_retries=0)
    server.usage = None
    server.limit_rate_per_minute(tps=4000, token_burst=4000)  # announced: 240,000 a minute
    await helpers(rlm).llm_query_batch([f"a{i:03d} " + "x" * 1995 for i in range(16)])
    await asyncio.sleep(1.2)  # the server's bucket refills; ours would hold the minute's
    rejected = server.rejected
    await helpers(rlm).llm_query_batch([f"b{i:03d} " + "x" * 1995 for i in range(16)])
    # Trusting the minute's budget as a burst, all 16 would go at once and 8 be refused.
    assert server.rejected - rejected <= 2
    assert not rlm.client.gate().tokens.distrusted


# -- what a refusal says it counted (issue 28: token buckets at their floor) ----------------


async def test_a_refusal_that_says_what_it_counted_teaches_the_count_before_any_answer():
    from .support.llm_server import minute_budget_limit

    server_side = minute_budget_limit(None, None, 20_000, 20_000, token_factor=1.5)
    gate = RateGate("openai/tokenizer")
    burst = [await gate.enter(2000.0) for _ in range(16)]  # nothing known: all at once
    refused = []
    for ticket in burst:
        admitted, headers = server_side.admit(2000)
        if admitted:
            gate.failed(ticket)  # (in flight; its answer would come a latency later)
        else:
            refused.append((ticket, headers, server_side.refusal))
    ticket, headers, sentence = refused[0]
    assert "Requested 3000" in sentence  # OpenAI's words, with the server's count
    gate.rate_limited_by(ticket, headers, sentence)
    for ticket, headers, sentence in refused[1:]:
        gate.rate_limited_by(ticket, headers, sentence)
    assert gate.count_ratio == pytest.approx(1.5)
    again = await gate.enter(2000.0)  # the refused are booked again as the server counts
    assert again.tokens == pytest.approx(3000) and again.counted


@pytest.mark.parametrize("wire_transport", [True, False], ids=["wire", "litellm"])
async def test_a_refusal_s_own_count_reaches_the_gate_through_either_transport(
    server, wire_transport
):
    rlm = make_rlm(server, max_retries=0, wire_transport=wire_transport)
    server.usage = None
    server.latency = 30  # no answer, so no usage report, while we look
    server.limit_rate_per_minute(tps=4000, token_burst=4000, token_factor=1.5)
    prompts = [f"{i:03d} " + "x" * 1996 for i in range(16)]  # 500 of our tokens, 750 its
    batch = asyncio.ensure_future(helpers(rlm).llm_query_batch(prompts))
    try:
        gate = rlm.client.gate()
        deadline = time.monotonic() + 60
        while gate.rate_limited == 0 and time.monotonic() < deadline:
            await asyncio.sleep(0.02)  # (the 429 comes back at once; the answers never)
        assert gate.rate_limited >= 1
        assert gate.count_ratio == pytest.approx(1.5)  # from its "Requested 750"
    finally:
        batch.cancel()
        await asyncio.gather(batch, return_exceptions=True)


async def test_usage_replaces_what_a_refusal_said_it_counted():
    gate = RateGate("openai/max-tokens")
    sentence = (
        "Rate limit reached for gpt-4o in organization org-x on tokens per min (TPM): "
        "Limit 30000, Used 29000, Requested {}. Please try again in 2s."
    )
    refused = await gate.enter(2000.0)
    # OpenAI counts max_tokens too: the refusal's figure is more than the prompt's.
    gate.rate_limited_by(refused, None, sentence.format(3000))
    gate.answered(await gate.enter(2000.0), None, 2200, 8000)  # the prompt's own count
    assert gate.count_ratio == pytest.approx(1.1)
    gate.rate_limited_by(await gate.enter(2000.0), None, sentence.format(3000))
    assert gate.count_ratio == pytest.approx(1.1)  # usage is known: it stands


@pytest.mark.parametrize(
    "message, tokens",
    [
        (
            "Rate limit reached for gpt-4o in organization org-u on tokens per min (TPM): "
            "Limit 30000, Used 29937, Requested 385. Please try again in 644ms.",
            385,
        ),
        (
            "litellm.RateLimitError: OpenAIException - Request too large for gpt-5 in "
            "organization org-1 on tokens per min (TPM): Limit 30000, Requested 36055.",
            36055,
        ),
        (
            "Rate limit reached for gpt-4 on requests per min (RPM): Limit 3, Used 3, Requested 1.",
            None,
        ),
        (
            "This request would exceed the rate limit for your organization of 20,000 "
            "input tokens per minute.",  # Anthropic's: the limit, not the request's count
            None,
        ),
        (None, None),
    ],
)
def test_what_a_refused_request_counted_in_openai_s_words(message, tokens):
    from rlm_magic.llm.ratelimit import requested_tokens

    assert requested_tokens(message) == tokens
