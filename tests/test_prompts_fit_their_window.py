"""Context windows: prompts that cannot fit are not sent, and windows are learned from
the provider's context-length errors. Over real HTTP against the local test server."""

from __future__ import annotations

import pytest

from rlm_magic import LLMQueryError, PromptTooLongError
from rlm_magic.errors import CompactionError
from rlm_magic.llm import profiles, windows

from .support import ROOT, helpers, make_rlm
from .support.backends import SANDBOXES
from .support.conversations import PROSE, long_conversation


def repl(code: str) -> str:
    return f"```repl\n{code}\n```\n"


@pytest.fixture(autouse=True)
def _forget_learned_windows():
    profiles.forget()
    yield
    profiles.forget()


async def test_an_oversized_sub_call_is_refused_in_the_repl_before_sending(server):
    rlm = make_rlm(server, context_window=2000, max_tokens=500)
    server.script("root-model", [repl("big = llm_query(context)\nprint(big)"), "FINAL(done)"])
    result = await rlm.arun("q", context=PROSE * 400)  # ~6,400 tokens
    seen = result.trajectory[0].code[0].output
    assert seen.startswith("Error: prompt is about ")
    assert (
        "tokens, the sub-model takes 1,744 (its 2,000-token window less 256 for the "
        "answer): cut the prompt by ~4,760 tokens (~19,040 characters); split it"
    ) in seen
    assert server.requests_for("sub-model") == []  # nothing was sent


async def test_a_prompt_that_fits_is_sent(server):
    rlm = make_rlm(server, context_window=2000, max_tokens=500)
    server.script("root-model", [repl("print(llm_query(context[:2000]))"), "FINAL(done)"])
    result = await rlm.arun("q", context=PROSE * 400)
    assert result.trajectory[0].code[0].output.startswith("echo: The quick")
    assert len(server.requests_for("sub-model")) == 1


async def test_notebook_llm_query_raises_prompt_too_long(server):
    rlm = make_rlm(server, context_window=2000, max_tokens=500)
    with pytest.raises(PromptTooLongError) as caught:
        await helpers(rlm).llm_query(PROSE * 400)
    assert isinstance(caught.value, LLMQueryError)
    assert "prompt is about" in str(caught.value) and "split it" in str(caught.value)
    assert caught.value.room == 2000 - 256 and caught.value.tokens > 1744
    assert server.requests == []


async def test_a_window_litellm_knows_is_used_without_configuration(server):
    rlm = make_rlm(server, sub_model="openai/gpt-4o-mini")  # 128k tokens to litellm
    with pytest.raises(PromptTooLongError) as caught:
        await helpers(rlm).llm_query("word " * 700_000)
    assert caught.value.room == 128_000 - 256  # max_tokens gives way to a short answer
    assert server.requests == []


async def test_the_window_is_learned_from_the_providers_error(server):
    server.context_window = 1000
    rlm = make_rlm(server)  # no window known: the first oversized prompt is sent
    with pytest.raises(LLMQueryError, match="maximum context length is 1000 tokens"):
        await helpers(rlm).llm_query(PROSE * 100)
    assert len(server.requests) == 1
    assert rlm.client.input_window("openai/sub-model") == 1000
    with pytest.raises(PromptTooLongError):
        await helpers(rlm).llm_query(PROSE * 100)
    assert len(server.requests) == 1  # the second one was not sent


async def test_llama_cpp_context_errors_are_understood(server):
    server.fail("context", model="sub-model")
    rlm = make_rlm(server)
    server.script("root-model", [repl("print(llm_query('hello'))"), "FINAL(done)"])
    result = await rlm.arun("q", context="c")
    seen = result.trajectory[0].code[0].output
    assert seen == (
        "Error: the prompt is over the sub-model's window of 4,096 tokens (the "
        "provider refused it, counting 23,009 tokens); split it"
    )


@pytest.fixture
def known_model():
    """A model litellm has a tokenizer and an entry for: its exact count stands."""
    profile = profiles.PROFILES.model("m")
    profile.model_info_asked, profile.model_info_window = True, 128_000
    yield "m"
    profiles.forget()


def test_near_limit_prompts_are_counted_exactly_and_clear_cases_are_not(known_model):
    import asyncio

    class Counter:
        calls = 0

        def token_counter(self, model, messages):
            Counter.calls += 1
            return 900

    small = [{"role": "user", "content": "x" * 400}]
    near = [{"role": "user", "content": "x" * 4000}]
    huge = [{"role": "user", "content": "x" * 100_000}]
    assert asyncio.run(windows.prompt_tokens_over(Counter(), "m", small, 1000)) is None
    assert Counter.calls == 0
    assert asyncio.run(windows.prompt_tokens_over(Counter(), "m", huge, 1000)) > 1000
    assert Counter.calls == 0
    assert asyncio.run(windows.prompt_tokens_over(Counter(), "m", near, 1000)) is None
    assert Counter.calls == 1  # 900 exact tokens fit, though 1,004 were estimated


# -- the root model's conversation fits its window -----------------------------------


def long_run(turns: int):
    """A root model that prints ~1,200 characters a turn for ``turns`` turns, then
    answers with how many turns its code counted and whether it can read `history`.
    Asked for a summary, it writes one."""
    state = {"turns": 0}

    def reply(body: dict) -> str:
        last = body["messages"][-1]["content"]
        if "Your conversation is about to be compacted" in last:
            return f"Summary: {state['turns']} turns done; `steps` counts them."
        state["turns"] += 1
        if state["turns"] == 1:
            return repl("steps = [1]\nprint(context[:1200])")
        if state["turns"] <= turns:
            return repl("steps.append(1)\nprint(context[:1200])")
        return repl("count = f'{len(steps)} {len(history) > 2 * len(steps)}'") + "FINAL_VAR(count)"

    return reply


@pytest.fixture(params=SANDBOXES)
def repl_kind(request) -> str:
    return request.param


async def test_a_run_three_times_its_window_long_is_compacted_and_succeeds(server, repl_kind):
    server.usage = None  # tokens counted as the window is: ~4 characters each
    server.context_window = 4000
    server.reply_with("root-model", long_run(40))
    rlm = make_rlm(
        server, context_window=4000, max_tokens=500, max_iterations=45, sandbox=repl_kind
    )
    result = await rlm.arun("How many turns?", context=PROSE * 40)
    assert result.success, result.error
    assert result.final_answer == "40 True"  # every turn counted; history has them all
    sent = sum(
        len(m["content"]) // 4
        for r in server.requests_for("root-model")
        for m in r["messages"][-1:]
    )
    assert sent > 3 * 4000  # the outputs add up to over three windows
    assert server.context_errors == 0  # compacted in time, every time
    assert len(result.compactions) >= 3
    first = result.compactions[0]
    assert first.reason == "threshold" and first.tokens_after < first.tokens_before
    assert first.input_tokens > 0 and first.summary.startswith("Summary:")
    assert result.trajectory[first.before_iteration - 1].compaction is first


async def test_a_context_length_error_compacts_and_retries_the_turn(server):
    server.usage = None
    server.context_window = 3000
    server.reply_with("root-model", long_run(12))
    rlm = make_rlm(server, max_tokens=500, max_iterations=20)  # no window known
    result = await rlm.arun("How many turns?", context=PROSE * 40)
    assert result.success, result.error
    assert result.final_answer == "12 True"
    assert server.context_errors == 1  # learned then, compacted in time afterwards
    assert result.compactions[0].reason == "context error"
    assert rlm.client.input_window("openai/root-model") == 3000


async def test_the_html_view_shows_where_the_conversation_was_compacted(server):
    server.usage = None
    server.context_window = 4000
    server.reply_with("root-model", long_run(12))
    rlm = make_rlm(server, context_window=4000, max_tokens=500, max_iterations=20, sandbox="none")
    result = await rlm.arun("How many turns?", context=PROSE * 40)
    view = result._repr_html_()
    assert f"{len(result.compactions)} compaction(s)" in view
    assert view.count("Conversation compacted (threshold)") == len(result.compactions)
    assert "Summary: " in view
    assert result.to_dict()["compactions"][0]["reason"] == "threshold"


# -- advice that fits the sub-model ---------------------------------------------------


async def test_the_system_prompt_advises_chunks_that_fit_the_sub_model(server):
    rlm = make_rlm(server, context_window=4096)  # a small local model
    server.script("root-model", ["FINAL(ok)"])
    await rlm.arun("q", context="c")
    system = server.requests_for("root-model")[0]["messages"][0]["content"]
    # 4,096 tokens less a quarter for answers (none seen yet), at 4 characters a token
    assert "it can read ~9.8k characters per prompt" in system
    assert "chunks (about 1.8k-7.4k characters" in system
    assert "100k" not in system


async def test_a_steps_output_is_cut_to_a_quarter_of_the_root_window(server):
    server.script("root-model", [repl("print('x' * 9000)"), "FINAL(ok)"])
    rlm = make_rlm(server, context_window=8192, sandbox="none")
    result = await rlm.arun("q", context="c")
    system = server.requests_for("root-model")[0]["messages"][0]["content"]
    assert "(cut to 8,200 characters)" in system  # 2,048 tokens at 4 characters
    seen = result.trajectory[0].code[0].output
    assert seen.startswith("x" * 8200) and "[output cut: " in seen


async def test_max_output_chars_set_by_the_user_wins_over_the_window(server):
    server.script("root-model", ["FINAL(ok)"])
    rlm = make_rlm(server, context_window=8192, max_output_chars=30_000)
    await rlm.arun("q", context="c")
    system = server.requests_for("root-model")[0]["messages"][0]["content"]
    assert "(cut to 30,000 characters)" in system


async def test_without_a_known_window_max_output_chars_stays(server):
    server.script("root-model", ["FINAL(ok)"])
    rlm = make_rlm(server)
    await rlm.arun("q", context="c")
    system = server.requests_for("root-model")[0]["messages"][0]["content"]
    assert "(cut to 20,000 characters)" in system


def test_a_servers_count_of_a_sample_outweighs_what_usage_taught():
    windows.learn_usage(ROOT, [{"role": "user", "content": "word " * 1000}], 1250)
    assert windows.chars_per_token(ROOT) == pytest.approx(5000 / 1246, rel=0.01)
    assert windows.learn_tokenizer(ROOT, 6000, 3429)  # log text, by the server's count
    assert windows.chars_per_token(ROOT) == pytest.approx(1.75, rel=0.01)
    assert not windows.learn_tokenizer(ROOT, 40, 10)  # too small to say
    assert windows.chars_per_token(ROOT) == pytest.approx(1.75, rel=0.01)


async def test_without_a_known_window_the_classic_advice_stays(server):
    rlm = make_rlm(server)
    server.script("root-model", ["FINAL(ok)"])
    await rlm.arun("q", context="c")
    system = server.requests_for("root-model")[0]["messages"][0]["content"]
    assert "~100k characters per prompt" in system and "20k-100k characters" in system


def test_window_settings_are_validated():
    from traitlets import TraitError

    from rlm_magic import RLM

    with pytest.raises(TraitError, match="context_window must be >= 256"):
        RLM(context_window=100)
    with pytest.raises(TraitError, match="compact_at must be between 0.1 and 1.0"):
        RLM(compact_at=1.5)
    assert RLM(context_window=8192, compact_at=0.5).compact_at == 0.5


async def test_a_large_prompt_near_the_limit_is_counted_off_the_loop(known_model):
    import threading

    threads = []

    class Counter:
        def token_counter(self, model, messages):
            threads.append(threading.current_thread())
            return 130_000

    near = [{"role": "user", "content": "x" * 540_000}]  # ~135k tokens by the estimate
    assert await windows.prompt_tokens_over(Counter(), "m", near, 120_000) == 130_000
    assert threads and threads[0] is not threading.main_thread()


async def test_litellm_is_asked_for_a_model_s_window_off_the_loop(server, monkeypatch):
    # For Ollama and Hugging Face models litellm's model info is an HTTP request.
    import threading

    from rlm_magic.llm.litellm_loader import load_litellm

    litellm = await load_litellm()
    asked = []

    def model_info(model, *args, **kwargs):
        asked.append((model, threading.current_thread()))
        return {"max_input_tokens": 8192}

    monkeypatch.setattr(litellm, "get_model_info", model_info)
    rlm = make_rlm(server, sub_model="openai/window-probe-model")
    assert await helpers(rlm).llm_query("x") == "echo: x"
    # Ours is the first ask, before the request is built (litellm asks again inside).
    assert asked[0] == ("openai/window-probe-model", asked[0][1])
    assert asked[0][1] is not threading.main_thread()


def test_the_summary_request_keeps_the_question_and_the_latest_exchanges():
    from rlm_magic.rlm.compaction import _fitted

    head = [{"role": "system", "content": "s" * 400}, {"role": "user", "content": "q" * 400}]
    exchanges = [
        {"role": role, "content": f"{n}" * 4000} for n in range(6) for role in ("assistant", "user")
    ]
    fitted = _fitted(head + exchanges, 4500)  # room for two exchanges of ~2,000 tokens
    assert fitted[:2] == head
    assert fitted[3]["content"] == "[8 earlier messages are left out here to fit your window]"
    assert [m["content"][0] for m in fitted[4:]] == ["4", "4", "5", "5"]
    assert [m["role"] for m in fitted] == [
        "system",
        "user",
        "assistant",
        "user",
        "assistant",
        "user",
        "assistant",
        "user",
    ]


async def test_a_router_groups_window_is_its_deployments_smallest(server):
    rlm = make_rlm(
        server,
        model_list=[
            {
                "model_name": "sub",
                "litellm_params": {"model": "openai/gpt-4o-mini", "api_base": server.base_url},
            },
            {
                "model_name": "sub",
                "litellm_params": {"model": "openai/gpt-4", "api_base": server.base_url},
            },
        ],
        sub_model="sub",
    )
    from rlm_magic.llm.litellm_loader import load_litellm

    await load_litellm()
    assert rlm.client.input_window("sub") == 8192  # gpt-4's, under gpt-4o-mini's 128k


# -- a summary that is cut off ----------------------------------------------------------


async def test_a_summary_cut_at_its_budget_is_asked_again_shorter_then_kept_marked(server):
    server.enforce_max_tokens = True
    server.reply_with("root-model", lambda body: "summary " * 400)
    rlm = make_rlm(server)
    record = await long_conversation(rlm).compact(1, "threshold")
    asked = server.requests_for("root-model")
    assert len(asked) == 2 and "keep this one under" in asked[1]["messages"][-1]["content"]
    assert record.cut_off and record.summary.endswith("[summary cut off at its max_tokens]")
    assert record.output_tokens == sum(r.output_tokens for r in rlm.client.ledger.records)


async def test_a_summary_that_breaks_off_twice_fails_the_compaction(server):
    server.stall_at, server.stall_for = 3, 30
    server.reply_with("root-model", lambda body: "summary " * 40)
    conversation = long_conversation(make_rlm(server, timeout=0.5))
    before = list(conversation.messages)
    with pytest.raises(CompactionError, match="its summary broke off twice"):
        await conversation.compact(1, "threshold")
    assert conversation.messages == before  # nothing replaced
