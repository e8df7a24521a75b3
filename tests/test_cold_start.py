"""A session's first model call through litellm imports it, which takes seconds: what a
user sees meanwhile; an OpenAI-compatible endpoint's calls never import it. Each test is
a fresh interpreter, where litellm is not imported yet."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

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


def test_a_prompt_near_the_window_is_counted_by_litellm(server):
    answer, _, _, _, imported = first_query(
        server, "word " * 400, context_window=2000, max_tokens=1000
    )
    assert answer.startswith("echo: word")
    assert imported


def test_a_refused_key_is_said_as_before_litellm_imported_to_say_it(server):
    server.fail("401")
    answer, *_, imported = first_query(server, "hi")
    assert answer.startswith("APIKeyError: the API key from RLM.api_key was refused"), answer
    assert "OPENAI_API_KEY" in answer
    assert imported
