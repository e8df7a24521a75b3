"""A session's first model call through litellm imports it, which takes seconds: what a
user sees meanwhile; an OpenAI-compatible endpoint's calls never import it. Each test is
a fresh interpreter, where litellm is not imported yet."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from dataclasses import dataclass

import pytest

from rlm_magic.llm import budget, profiles, windows
from rlm_magic.llm.usage import UsageLedger

pytestmark = pytest.mark.slow

FIRST_BATCH = """
import asyncio, sys
from rlm_magic import RLM
from rlm_magic.jupyter.helpers import NotebookHelpers

async def main():
    # (through litellm: the wire transport, for such an endpoint, imports no litellm)
    rlm = RLM(model="openai/root-model", sub_model="openai/sub-model", api_base=sys.argv[1],
              api_key="sk-test", progress=True, wire_transport=False)
    assert "litellm" not in sys.modules
    print(await NotebookHelpers(rlm).llm_query_batch(["a", "b"]))

asyncio.run(main())
"""


def test_the_first_batch_says_it_is_loading_litellm_not_that_calls_are_in_flight(server):
    done = subprocess.run(
        [sys.executable, "-c", FIRST_BATCH, server.base_url],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "['echo: a', 'echo: b']"
    # The progress line, as rewritten in place on stderr, one state per rewrite (text
    # mode reads each "\r" as a line end).
    states = [s.strip() for s in done.stderr.splitlines() if s.strip()]
    loading = [s for s in states if "loading litellm…" in s]
    assert loading, states
    assert all("in flight" not in s for s in loading)
    assert states[-1].startswith("llm_query_batch: 2/2 done")
    assert len(server.requests) == 2


FIRST_QUERY = """
import asyncio, json, resource, sys, time
from rlm_magic import RLM
from rlm_magic.jupyter.helpers import NotebookHelpers

async def main():
    settings = json.loads(sys.argv[4]) if len(sys.argv) > 4 else {}
    rlm = RLM(model=sys.argv[2], api_base=sys.argv[1], api_key="sk-test", progress=False,
              retry_backoff=0.01, **settings)
    try:
        answer = await NotebookHelpers(rlm).llm_query(sys.argv[3] if len(sys.argv) > 3 else "hi")
    except Exception as exc:
        answer = f"{type(exc).__name__}: {exc}"
    record = rlm.client.ledger.records[-1] if rlm.client.ledger.records else None
    print(json.dumps([answer, record and record.input_tokens, record and record.output_tokens,
                      record and record.cost_usd, "litellm" in sys.modules]))

asyncio.run(main())
"""


@pytest.mark.parametrize("model", ["openai/sub-model", "openai/gpt-4o-mini"])
def test_an_openai_compatible_endpoint_answers_without_importing_litellm(server, model):
    done = subprocess.run(
        [sys.executable, "-c", FIRST_QUERY, server.base_url, model],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    answer, input_tokens, output_tokens, cost, imported = json.loads(done.stdout)
    assert answer == "echo: hi"
    assert not imported
    # The same price as litellm's own reckoning for this usage (None: it has none).
    from rlm_magic.llm.litellm_loader import import_litellm

    litellm = import_litellm()
    try:
        expected = sum(
            litellm.cost_per_token(
                model=model, prompt_tokens=input_tokens, completion_tokens=output_tokens
            )
        )
    except Exception:  # noqa: BLE001 - litellm prices no such model
        expected = None
    assert cost == expected
    assert len(server.requests) == 1


def first_query(server, prompt: str, **settings) -> list:
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            FIRST_QUERY,
            server.base_url,
            "openai/sub-model",
            prompt,
            json.dumps(settings),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_a_server_that_sends_no_usage_is_counted_by_the_estimate_without_litellm(server):
    server.usage, server.stream_usage = None, False
    server.finish_word = "eos_token"  # (litellm's table, copied, says "stop")
    answer, input_tokens, output_tokens, _, imported = first_query(server, "x" * 400)
    assert answer == "echo: " + "x" * 400
    assert (input_tokens, output_tokens) == (100 + 4, round(406 / 4))
    assert not imported


def test_a_refused_key_is_said_as_before_litellm_imported_to_say_it(server):
    server.fail("401")
    answer, *_, imported = first_query(server, "hi")
    assert answer.startswith("APIKeyError: the API key from RLM.api_key was refused"), answer
    assert "OPENAI_API_KEY" in answer
    assert imported


# -- the wire path never waits for litellm, near the window included ----------------------
# A llama.cpp server with a 4,096-token window: at the default max_tokens (4,096) every
# prompt is near it. Its token count once imported litellm: 5 s before the first request.

FIRST_REQUEST = """
import asyncio, json, sys, time

imported_at = []


def watch(event, args):  # when litellm's import starts, if it does
    if event == "import" and args[0] == "litellm" and not imported_at:
        imported_at.append(time.monotonic())


sys.addaudithook(watch)

from rlm_magic import RLM
from rlm_magic.jupyter.helpers import NotebookHelpers


async def main():
    how = json.loads(sys.argv[2])
    rlm = RLM(api_base=sys.argv[1], api_key="sk-test", progress=False, **how["settings"])
    helpers, prompt = NotebookHelpers(rlm), how["prompt"]
    started = time.monotonic()  # (the cell starts: rlm_magic is loaded, as after %load_ext)
    try:
        if how["ask"] == "batch":  # as many as the server's slots
            answer = await helpers.llm_query_batch([f"{i} {prompt}" for i in range(8)])
        elif how["ask"] == "run":
            answer = (await rlm.arun("q", context=prompt)).answer
        else:
            answer = await helpers.llm_query(prompt)
    except Exception as exc:
        answer = f"{type(exc).__name__}: {exc}"
    print(json.dumps({"started": started, "litellm_at": imported_at[0] if imported_at else None,
                      "answer": str(answer)[:300]}))


asyncio.run(main())
"""

SUB_MODEL = {"model": "openai/sub-model"}
PRICED = {"model": "openai/gpt-4o-mini"}  # in litellm's price map: a budget holds it
BUDGET = {"max_session_cost_usd": 1.0}
NEAR = "word " * 1600  # ~2,000 tokens: half the window, or all that max_tokens leaves


@dataclass
class FirstCall:
    to_request: float | None  # seconds from the call's start to its request's arrival
    litellm_at: float | None  # seconds from the call's start to litellm's import
    answer: str


def first_call(server, settings: dict, prompt: str = "hi", ask: str = "query") -> FirstCall:
    """The first call of a fresh interpreter (``ask``: "query", "batch" or "run") at
    ``server``, playing llama.cpp with a 4,096-token window."""
    server.reports_window = ("llama.cpp", 4096)
    how = {"settings": settings, "prompt": prompt, "ask": ask}
    done = subprocess.run(
        [sys.executable, "-c", FIRST_REQUEST, server.base_url, json.dumps(how)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    child = json.loads(done.stdout)
    started, litellm_at = child["started"], child["litellm_at"]
    return FirstCall(
        server.arrivals[0] - started if server.arrivals else None,  # (one clock: monotonic)
        None if litellm_at is None else litellm_at - started,
        child["answer"],
    )


@pytest.mark.parametrize(
    "settings, prompt, ask",
    [
        pytest.param(SUB_MODEL, "hi", "query", id="max_tokens at its default"),
        pytest.param(SUB_MODEL, NEAR, "query", id="a prompt of half the window"),
        pytest.param({**SUB_MODEL, "max_tokens": 2048}, NEAR, "query", id="max_tokens=2048"),
        pytest.param({**SUB_MODEL, "max_tokens": 3900}, "x" * 700, "query", id="max_tokens=3900"),
        pytest.param({**SUB_MODEL, **BUDGET}, NEAR, "query", id="a budget, unpriced"),
        pytest.param({**PRICED, **BUDGET}, NEAR, "query", id="a budget, priced"),
        pytest.param(SUB_MODEL, "hi", "batch", id="a batch of 8"),
        pytest.param({**PRICED, **BUDGET}, NEAR, "batch", id="a batch of 8 under a budget"),
        pytest.param(
            {"model": "openai/root-model", "sub_model": "openai/sub-model"}, NEAR, "run", id="a run"
        ),
    ],
)
@pytest.mark.parametrize("tokenizes", [False, True], ids=["no /tokenize", "/tokenize"])
def test_the_first_request_leaves_at_once_without_litellm_at_every_default(
    server, settings, prompt, ask, tokenizes
):
    server.tokenizes = tokenizes
    server.script("root-model", ["FINAL(ok)"])
    call = first_call(server, settings, prompt, ask)
    assert call.to_request is not None, call.answer
    # Generous, for a machine shared with other suites: ~0.3 s on an idle one, 2.3 s
    # seen under a load of 4.5 on two cores, where litellm's import alone takes 10 s.
    assert call.to_request < 4.0, call
    assert call.litellm_at is None or call.litellm_at > call.to_request, call
    assert call.answer.startswith(("echo: ", "['echo: ", "ok")), call


def test_a_prompt_over_the_window_is_refused_unsent_without_litellm(server):
    call = first_call(server, SUB_MODEL, "word " * 4000)  # ~5,000 tokens by the estimate
    assert call.answer.startswith("PromptTooLongError: "), call
    assert call.to_request is None and call.litellm_at is None


def test_a_near_prompt_asks_no_more_answer_than_the_servers_count_leaves(server):
    server.tokenizes, server.chars_per_token = True, 2.0  # twice the tokens we estimate
    call = first_call(server, SUB_MODEL, "x" * 4000)
    assert call.answer.startswith("echo: x") and call.litellm_at is None
    # 2,000 tokens by the server's count (and 4 for the message): less a 5% margin
    assert server.requests[0]["max_tokens"] == 4096 - 2004 - 100
    assert server.tokenize_asks == [4000]


# -- counting without litellm ---------------------------------------------------------------


def test_without_a_tokenizer_digits_and_cjk_count_a_token_each_punctuation_half():
    profiles.forget()
    prose = [{"role": "user", "content": "word " * 400}]
    digits = [{"role": "user", "content": "1234567890" * 200}]
    cjk = [{"role": "user", "content": "漢字" * 1000}]
    json_text = [{"role": "user", "content": '{"a": [1, 2]}' * 100}]  # 8 marks, 2 digits
    assert windows.cautious_estimate(prose, "m") == 500 + 4  # as the estimate
    assert windows.cautious_estimate(digits, "m") == 2000 + 4
    assert windows.cautious_estimate(cjk, "m") == 2000 + 4
    assert windows.cautious_estimate(json_text, "m") == 100 * (3 / 4 + 2 + 8 / 2) + 4
    fits = asyncio.run(windows.fit_answer(None, "m", cjk, 4096, 4096))
    assert fits == 4096 - 2004 - 100  # not 4096 - 504 (the estimate's 4 a token)


def test_a_budget_holds_a_large_prompt_at_its_bytes_without_litellm():
    messages = [{"role": "user", "content": "word " * 1000}]  # 5,000 bytes
    held = asyncio.run(budget.input_tokens_at_most(None, "openai/gpt-4o-mini", messages))
    assert held == 5000 + 8  # (8 a message for the template)


def test_an_answer_streamed_without_a_tokenizer_counts_its_digits_a_token_each():
    reservation = budget.Reservation([], "m", output_tokens=100)
    assert reservation._count("1234567890" * 10) == 100
    assert reservation._count("word " * 80) == 100


def test_a_budget_near_its_end_counts_a_large_prompt_rather_than_refuse_it_at_its_bytes():
    ledger = UsageLedger()
    ledger.budget = budget.CostBudget(ledger, 0.002, "max_cost_usd")  # 2,000 tokens at $1/M
    messages = [{"role": "user", "content": "word " * 1000}]  # 5,000 bytes, ~1,300 tokens
    held = asyncio.run(
        budget.admit(ledger, None, "openai/gpt-4o-mini", (1e-6, 0.0), messages, {"max_tokens": 1})
    )
    assert held is not None and 0.001 < held.amount < 0.0015  # counted (litellm imported)


FIRST_TYPED_QUERY = """
import asyncio, json, sys
from rlm_magic import RLM
from rlm_magic.jupyter.helpers import NotebookHelpers

async def main():
    rlm = RLM(model="openai/sub-model", api_base=sys.argv[1], api_key="sk-test",
              progress=False, retry_backoff=0.01)
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    answer = await NotebookHelpers(rlm).llm_query("count", response_format=schema)
    print(json.dumps([answer, "litellm" in sys.modules]))

asyncio.run(main())
"""


def test_a_typed_answer_over_the_wire_is_asked_for_without_importing_litellm(server):
    server.script("sub-model", ['{"n": 3}'])
    done = subprocess.run(
        [sys.executable, "-c", FIRST_TYPED_QUERY, server.base_url],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    answer, imported = json.loads(done.stdout)
    assert answer == {"n": 3}
    assert not imported
    [request] = server.requests
    assert request["response_format"]["type"] == "json_schema"
