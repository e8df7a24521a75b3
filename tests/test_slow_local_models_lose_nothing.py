"""Local and slow models (llama.cpp, vLLM, Ollama): nothing generated is thrown away, and
the window the server really has is the one planned for. Over real HTTP against the
local test server playing such servers: generating at a few hundred tokens a second,
reporting its window at their endpoints, tokenizing at other than 4 characters a token.

Times are scaled down from the real case (20 tokens/s, 4,096-token answers, a 120 s
timeout): the answers take twice the timeout, as they did there."""

from __future__ import annotations

import asyncio
import re
import time

import pytest

from rlm_magic import PromptTooLongError
from rlm_magic.demo import split_tokens
from rlm_magic.jupyter.progress import BatchProgress
from rlm_magic.llm import local_servers, profiles, slots, windows

from .support import SUB, helpers, make_rlm


def repl(code: str) -> str:
    return f"```repl\n{code}\n```\n"


@pytest.fixture(autouse=True)
def _fresh_windows():
    profiles.forget()
    yield
    profiles.forget()


WORDS = 400  # an answer's tokens (one streamed piece each)


@pytest.fixture(params=["wire", "litellm"])
def transport(request) -> dict:
    """Both ways a call reaches an OpenAI-compatible server (RLM.wire_transport)."""
    return {"wire_transport": request.param == "wire"}


def long_answer(body: dict) -> str:
    # Words that differ: litellm takes a chunk repeated 100 times for a stuck model.
    return "".join(f"w{i} " for i in range(WORDS))


# -- nothing generated is thrown away ---------------------------------------------------


@pytest.mark.slow  # answers longer than a timeout, on purpose
async def test_a_batch_of_answers_longer_than_the_timeout_all_arrive_generated_once(
    server, transport
):
    # 400 tokens at 60/s: over six seconds an answer, twice the (stall) timeout, which
    # leaves a loaded machine (litellm parses each chunk on the loop) room for a pause: a
    # 2 s timeout was once outwaited with two whole suites sharing two cores.
    server.generation_rate = 60
    server.reply_with("sub-model", long_answer)
    rlm = make_rlm(server, timeout=3.0, **transport)
    started = time.monotonic()
    answers = await helpers(rlm).llm_query_batch([f"question {i}" for i in range(4)])
    assert [len(a.split()) for a in answers] == [WORDS] * 4
    assert server.tokens_generated == 4 * WORDS  # no token generated twice
    assert len(server.requests) == 4
    assert rlm.usage().output_tokens > 0
    assert time.monotonic() - started < 30  # one answer's time, not a retry's


async def test_batch_items_in_a_repl_step_stream_past_the_timeout(server):
    server.generation_rate = 200
    server.reply_with("sub-model", long_answer)
    root = [
        repl("out = llm_query_batch(['a', 'b', 'c'])\nprint([len(o.split()) for o in out])"),
        "FINAL(done)",
    ]
    server.script("root-model", list(root))
    rlm = make_rlm(server, timeout=1.0, sandbox="none")
    result = await rlm.arun("q", context="c")
    assert result.trajectory[0].code[0].output.strip() == f"[{WORDS}, {WORDS}, {WORDS}]"
    root_tokens = sum(len(split_tokens(reply)) for reply in root)
    assert server.tokens_generated == 3 * WORDS + root_tokens


async def test_an_answer_whose_server_went_away_keeps_its_text(server, transport):
    server.reply_with("sub-model", long_answer)
    server.drop_at = 30
    rlm = make_rlm(server, **transport)
    answer = await helpers(rlm).llm_query("q")
    assert answer.startswith(long_answer({})[:110] + "\n[answer cut off: ")
    assert len(server.requests) == 1  # not asked again from zero
    assert rlm.usage().by_model[SUB].errors == 0


async def test_a_sub_call_cut_by_the_step_deadline_keeps_its_text(server, transport):
    server.generation_rate = 100
    server.reply_with("sub-model", long_answer)  # four seconds
    server.script("root-model", [repl("part = llm_query('q')\nprint(part[-120:])"), "FINAL(done)"])
    rlm = make_rlm(server, step_timeout=2.5, sandbox="none", **transport)
    result = await rlm.arun("q", context="c")
    seen = result.trajectory[0].code[0].output
    assert re.search(r"w\d+ \n\[answer cut off: the REPL step's time ran out after ", seen)
    assert server.tokens_generated < WORDS  # cut, and not asked again


# -- the window the server really has ---------------------------------------------------


@pytest.mark.parametrize(
    "kind,path", [("llama.cpp", "/props"), ("vllm", "/v1/models"), ("ollama", "/api/show")]
)
async def test_a_local_servers_window_is_known_before_the_first_call(server, kind, path):
    server.reports_window = (kind, 4096)
    server.script("root-model", ["FINAL(ok)"])
    rlm = make_rlm(server)  # no window configured, none in litellm's map
    await rlm.arun("q", context="c")
    system = server.requests_for("root-model")[0]["messages"][0]["content"]
    assert "100k" not in system and "it can read ~9.8k characters per prompt" in system
    assert rlm.client.input_window(SUB) == 4096
    assert path in server.window_asks
    asks = len(server.window_asks)
    await helpers(rlm).llm_query("again")
    assert len(server.window_asks) == asks  # asked once per server and model


async def test_a_server_that_reports_no_window_costs_no_wait(server):
    rlm = make_rlm(server)
    started = time.monotonic()
    assert await helpers(rlm).llm_query("x") == "echo: x"
    assert time.monotonic() - started < 30
    assert rlm.client.input_window(SUB) is None
    assert set(server.window_asks) >= {"/props", "/v1/models", "/api/show"}


async def test_only_openai_compatible_and_ollama_servers_are_asked(server):
    claude = "anthropic/claude-sonnet-4-5"
    rlm = make_rlm(server, sub_model=claude, api_base=server.anthropic_base)
    assert await helpers(rlm).llm_query("x") == "echo: x"
    assert server.window_asks == []


async def test_a_configured_window_wins_over_ollamas_default(server):
    server.ollama_default = True  # no num_ctx, no model loaded: 4,096 is only a guess
    rlm = make_rlm(server, context_window=32768)
    assert (await helpers(rlm).llm_query("word " * 5000)).startswith("echo: word")
    assert rlm.client.input_window(SUB) == 32768


async def test_ollamas_default_is_advice_and_the_server_is_asked_again(server, monkeypatch):
    server.ollama_default = True
    rlm = make_rlm(server)
    # ~6,000 tokens over a guessed 4,096: sent all the same (the server decides).
    assert (await helpers(rlm).llm_query("word " * 5000)).startswith("echo: word")
    assert rlm.client.input_window(SUB) is None
    assert rlm.client.input_window(SUB, advice=True) == 4096  # for chunk sizes
    monkeypatch.setattr(local_servers, "GUESS_KEPT_S", 0.0)
    server.ollama_loaded = 8192  # loaded since: /api/ps says its window
    await helpers(rlm).llm_query("again")
    assert rlm.client.input_window(SUB) == 8192


async def test_a_host_off_the_local_network_is_asked_only_its_model_list(server, monkeypatch):
    async def not_local(host):  # the test server is on 127.0.0.1: play a remote host
        return False

    monkeypatch.setattr(local_servers, "is_local", not_local)
    server.reports_window = ("llama.cpp", 4096)
    rlm = make_rlm(server)
    assert await helpers(rlm).llm_query("x") == "echo: x"
    assert server.window_asks == ["/v1/models"]
    assert rlm.client.input_window(SUB) is None


async def test_loopback_private_and_link_local_hosts_are_local_and_others_not():
    for host in (
        "127.0.0.1",
        "::1",
        "localhost",
        "10.1.2.3",
        "192.168.0.9",
        "169.254.1.1",
        "fe80::1",
    ):
        assert await local_servers.is_local(host), host
    for host in ("8.8.8.8", "2001:4860:4860::8888", "", None):
        assert not await local_servers.is_local(host), host


async def test_a_probe_answer_over_a_megabyte_is_not_read(server):
    server.props_size = 2_000_000
    rlm = make_rlm(server)
    assert await helpers(rlm).llm_query("x") == "echo: x"
    assert "/props" in server.window_asks
    assert rlm.client.input_window(SUB) is None


async def test_characters_per_token_are_learned_from_usage_and_advised(server):
    server.usage = None
    server.chars_per_token = 1.75  # Gemma on log text
    server.reply_with("sub-model", "ok")
    rlm = make_rlm(server, context_window=4096, sandbox="none")
    await helpers(rlm).llm_query("2024-01-01 ERROR x=1; " * 100)
    assert windows.chars_per_token(SUB) == pytest.approx(1.75, rel=0.05)
    server.script("root-model", ["FINAL(ok)"])
    await rlm.arun("q", context="c")
    system = server.requests_for("root-model")[0]["messages"][0]["content"]
    # 4,096 tokens less 256 for answers as short as the one seen, at 1.75 a token
    assert "it can read ~5.4k characters per prompt" in system


LOG = "2024-01-01 12:00:01 ERROR svc[42]: x=1 y=2 retry=3\n"


@pytest.mark.parametrize("kind", ["llama.cpp", "vllm"])
async def test_the_first_advice_reads_the_context_as_the_servers_tokenizer_counts_it(server, kind):
    # Gemma reads log text at 1.75 characters a token: the first advice assumed 4
    # ("1.8k-7.4k characters" on a 4,096 window, 7.4k of them past the window).
    server.reports_window = (kind, 4096)
    server.tokenizes = True
    server.chars_per_token = 1.75
    server.script("root-model", ["FINAL(ok)"])
    rlm = make_rlm(server, sandbox="none")
    await rlm.arun("q", context=LOG * 400)  # 20,000 characters
    system = server.requests_for("root-model")[0]["messages"][0]["content"]
    # 4,096 tokens less a quarter for answers, at 1.75 characters a token, before any
    # usage report; a step's output cut to a quarter of the root window.
    assert "it can read ~4.3k characters per prompt" in system
    assert "(cut to 1,800 characters)" in system
    assert 0 < max(server.tokenize_asks) <= 6000  # a sample, not the context
    assert windows.chars_per_token(SUB) == pytest.approx(1.75, rel=0.05)


async def test_a_server_without_a_tokenizer_leaves_the_advice_to_usage(server):
    server.reports_window = ("llama.cpp", 4096)  # no /tokenize
    server.script("root-model", ["FINAL(ok)"])
    rlm = make_rlm(server, sandbox="none")
    await rlm.arun("q", context=LOG * 400)
    system = server.requests_for("root-model")[0]["messages"][0]["content"]
    assert "it can read ~9.8k characters per prompt" in system
    assert "(cut to 4,100 characters)" in system  # a quarter of 4,096 tokens at 4


async def test_a_context_refusal_is_not_retried_and_corrects_the_estimate(server, transport):
    server.usage = None
    server.chars_per_token = 2.0  # twice the tokens our estimate counts
    server.context_window = 1000
    rlm = make_rlm(server, context_window=1000, max_tokens=100, **transport)
    prose = "The quick brown fox jumps over the lazy dog near the river bank. "
    prompt = prose[:60] * 40  # 2,400 characters: ~600 tokens to us, 1,200 to the server
    with pytest.raises(Exception, match="maximum context length is 1000 tokens"):
        await helpers(rlm).llm_query(prompt)
    assert len(server.requests) == 1  # never retried
    assert windows.chars_per_token(SUB) == pytest.approx(2.0, rel=0.05)
    with pytest.raises(PromptTooLongError):
        await helpers(rlm).llm_query(prompt)
    assert len(server.requests) == 1  # the estimate now knows: not sent


async def test_a_prompt_that_fits_with_a_smaller_answer_is_sent_with_less_max_tokens(server):
    # The case: a 3,509-token prompt at max_tokens=4096 on a 4,096-token window.
    server.context_window, server.counts_max_tokens = 4096, True
    rlm = make_rlm(server, context_window=4096)  # max_tokens: the default 4096
    assert (await helpers(rlm).llm_query("x" * 3509 * 4)).startswith("echo: xxx")
    sent = server.requests[0]["max_tokens"]
    assert 256 <= sent <= 4096 - 3509
    assert server.context_errors == 0


async def test_a_prompt_too_long_says_what_to_cut_with_numbers(server):
    rlm = make_rlm(server, context_window=4096)
    with pytest.raises(PromptTooLongError) as caught:
        await helpers(rlm).llm_query("x" * 20_000)  # ~5,000 tokens
    message = str(caught.value)
    assert "the model takes 3,840 (its 4,096-token window less 256 for the answer)" in message
    assert "cut the prompt by ~1,16" in message and "characters); split it" in message
    assert server.requests == []


async def test_a_refusal_of_prompt_and_max_tokens_says_to_lower_max_tokens(server):
    server.context_window, server.counts_max_tokens = 4096, True
    server.chars_per_token = 3.0  # our estimate undercounts: the server refuses
    server.script("root-model", [repl("print(llm_query('y' * 10_500))"), "FINAL(done)"])
    rlm = make_rlm(server, sandbox="none", max_tokens=1000)
    result = await rlm.arun("q", context="c")
    seen = result.trajectory[0].code[0].output
    assert seen.startswith(
        "Error: the provider counts the prompt at 3,500 tokens and max_tokens=1,000 does not fit"
    )
    assert "ask with max_tokens <= 596, or cut the prompt" in seen


async def test_a_window_learned_mid_run_updates_the_chunk_advice(server):
    server.context_window = 4096  # refuses; the error names the window
    server.script("root-model", [repl("print(llm_query('z' * 40_000))"), "FINAL(done)"])
    rlm = make_rlm(server, sandbox="none")
    await rlm.arun("q", context="c")
    first, second = (r["messages"][0]["content"] for r in server.requests_for("root-model"))
    assert "~100k characters per prompt" in first
    assert "it can read ~9.8k characters per prompt" in second


# -- a local server's slots ------------------------------------------------------------


def short_answer(body: dict) -> str:
    return "".join(f"s{i} " for i in range(20))  # 20 tokens: half a second at 40/s


async def test_calls_past_a_servers_slots_wait_on_our_side_and_none_is_taken_for_stalled(
    server,
):
    # The case scaled down: 64 prompts of 128 tokens against 8 slots at
    # timeout=30 lost 16. Here 32 answers of half a second against 4 slots that queue
    # the rest: queued at the server, the last of eight waves would wait 3.5 s for its
    # first token, past a 1 s timeout.
    server.slots = 4
    server.generation_rate = 40
    server.reply_with("sub-model", short_answer)
    rlm = make_rlm(server, timeout=1.0, max_concurrency=64)
    seen: list[str] = []

    async def watch() -> None:
        line = BatchProgress(32, "llm_query_batch", enabled=False).line
        while True:
            message = slots.hold_message()
            if message:
                seen.append((message, message in line()))
            await asyncio.sleep(0.05)

    watcher = asyncio.ensure_future(watch())
    try:
        answers = await helpers(rlm).llm_query_batch(
            [f"q{i}" for i in range(32)], return_exceptions=True
        )
    finally:
        watcher.cancel()
    assert [len(str(a).split()) for a in answers] == [20] * 32
    assert server.peak_in_flight <= 4 and server.peak_queued == 0
    usage = rlm.usage().by_model[SUB]
    assert usage.retries == 0 and usage.errors == 0
    assert len(server.requests_for("sub-model")) == 32
    # The rest waited on our side, and the progress line says so.
    assert seen and re.fullmatch(r"\d+ waiting for the server's 4 slots", seen[0][0])
    assert all(shown for _, shown in seen)  # in the batch's progress line


@pytest.mark.parametrize("kind", ["llama.cpp", "vllm"])
async def test_before_its_first_token_a_call_queued_at_a_busy_server_is_not_stalled(server, kind):
    # A server running fewer requests than we hold to (another client has the rest:
    # llama.cpp says 8 slots, vLLM says none): ours queue there, and the server says
    # it is working (llama.cpp's /slots, vLLM's /metrics).
    server.slots = 2
    if kind == "llama.cpp":
        server.reported_slots = 8
    else:
        server.reports_window = ("vllm", 8192)
    server.generation_rate = 40
    server.reply_with("sub-model", short_answer)
    rlm = make_rlm(server, timeout=0.6, max_concurrency=8)
    answers = await helpers(rlm).llm_query_batch(
        [f"q{i}" for i in range(8)], return_exceptions=True
    )
    assert [len(str(a).split()) for a in answers] == [20] * 8
    assert server.peak_queued > 0 and server.busy_asks > 0
    usage = rlm.usage().by_model[SUB]
    assert usage.retries == 0 and usage.errors == 0


async def test_a_call_at_a_server_that_says_it_is_idle_still_stalls(server):
    server.reports_window = ("llama.cpp", 4096)  # 8 slots, none of them processing
    server.fail("hang", times=1)
    rlm = make_rlm(server, timeout=0.5, max_retries=0)
    with pytest.raises(Exception, match="no new tokens for 0.5s"):
        await helpers(rlm).llm_query("x")
    assert "/slots" in server.window_asks  # asked whether it was working


async def test_a_stall_after_the_first_token_is_a_stall_however_busy_the_server(server):
    server.slots = 2
    server.reply_with("sub-model", short_answer)
    server.stall_at, server.stall_for = 3, 5.0  # its slot stays busy all the while
    rlm = make_rlm(server, timeout=0.5, max_retries=0)
    answer = await helpers(rlm).llm_query("x")
    assert answer.startswith("s0 s1 s2") and "no new tokens for 0.5s" in answer.reason


# -- compaction on a small root window --------------------------------------------------


def chatty_root(turns: int):
    """A root model printing ~2,400 characters a turn for ``turns`` turns; asked for a
    summary, it writes a long one (as Gemma did)."""
    state = {"turns": 0}

    def reply(body: dict) -> str:
        last = body["messages"][-1]["content"]
        if "Your conversation is about to be compacted" in last:
            return "Summary: " + "progress noted. " * 400  # ~6,400 characters
        state["turns"] += 1
        if state["turns"] <= turns:
            return repl("print(context[:2400])")
        return repl("FINAL('finished')")

    return reply


async def test_a_run_on_a_4096_token_root_window_compacts_and_finishes(server):
    server.usage = None
    server.context_window = 4096
    server.reports_window = ("llama.cpp", 4096)
    server.enforce_max_tokens = True
    server.reply_with("root-model", chatty_root(12))
    rlm = make_rlm(server, sandbox="none", max_iterations=16)  # max_tokens: 4096
    result = await rlm.arun("q", context="The quick brown fox. " * 200)
    assert result.success, result.error
    assert result.final_answer == "finished"
    assert result.compactions and server.context_errors == 0
    summaries = [
        r
        for r in server.requests_for("root-model")
        if "about to be compacted" in r["messages"][-1]["content"]
    ]
    assert summaries and all(r["stream"] for r in summaries)
    assert all(r["max_tokens"] <= 1024 for r in summaries)  # a quarter of the window
    for record in result.compactions:
        assert record.tokens_after < record.tokens_before


async def test_a_window_too_small_for_the_question_fails_with_its_own_message(server):
    server.reply_with("root-model", chatty_root(50))
    rlm = make_rlm(server, sandbox="none", context_window=1200, max_tokens=300, max_iterations=6)
    result = await rlm.arun("why? " * 400, context="c" * 100)  # a 2,000-character question
    assert not result.success
    assert (
        "could not be compacted" in result.error or "cannot hold its system prompt" in result.error
    )
    assert "split it" not in result.error


# -- what counts as an answer, and the minor items --------------------------------------


async def test_an_answer_made_only_of_error_strings_is_not_a_success(server):
    server.fail("500", times=99, model="sub-model")
    server.script("root-model", [repl("out = llm_query_batch(['a', 'b'])"), "FINAL_VAR(out)"])
    rlm = make_rlm(server, sandbox="none", max_retries=0)
    result = await rlm.arun("q", context="c")
    assert not result.success
    assert result.error.startswith("the final answer is an error message, not an answer")


@pytest.mark.parametrize("sandbox", ["none", "process"])
async def test_keyboard_interrupt_raised_by_model_code_is_its_own_error(server, sandbox):
    server.script("root-model", [repl("raise KeyboardInterrupt('mine')"), "FINAL(done)"])
    rlm = make_rlm(server, sandbox=sandbox)
    result = await rlm.arun("q", context="c")
    seen = result.trajectory[0].code[0].output
    assert "KeyboardInterrupt: mine" in seen and "the step was stopped" not in seen


def test_a_cache_saving_at_no_known_price_reads_unknown():
    from rlm_magic.llm.usage import CallRecord, UsageLedger

    ledger = UsageLedger()
    ledger.record(
        CallRecord("openai/local", 100, 10, None, cached_input_tokens=80, cache_saved_usd=None)
    )
    table = repr(ledger.summary())
    assert "$0.0000" not in table
    assert table.splitlines()[-1].split()[-1] == "?"


async def test_litellms_logging_worker_does_not_stay_on_the_loop(server):
    rlm = make_rlm(server, wire_transport=False)  # litellm's own transport
    await helpers(rlm).llm_query("x")

    def workers():
        return [t for t in asyncio.all_tasks() if "_worker_loop" in repr(t.get_coro())]

    deadline = time.monotonic() + 10
    while workers() and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    assert workers() == []
