"""The client's pipeline (cache, prepare, send with retries, record) against a scripted
transport: the seam every transport fills (``llm.transports.base.Transport``), with no
HTTP at all. The same behaviours are tested over real HTTP elsewhere; these show that
the client's rules belong to the client, whichever transport sends."""

from __future__ import annotations

import pytest

from rlm_magic.errors import APIKeyError, ConfigError, LLMQueryError

from .support.scripted import MODEL, BrokenOff, HTTPFailure, answer, scripted_client

QUESTION = [{"role": "user", "content": "q"}]


@pytest.fixture(autouse=True)
def _litellm(litellm_imported):
    """The client loads litellm for prices and windows, whatever transport sends."""


async def test_every_call_goes_to_the_transport_the_client_was_given():
    client, transport = scripted_client(answer("hello"))
    done = await client.complete(QUESTION)
    assert done.text == "hello" and done.cost_usd == 0.001
    [request] = transport.requests
    assert (request["model"], request["messages"], request["max_retries"]) == (MODEL, QUESTION, 0)
    assert client.transport(MODEL) is transport


async def test_a_server_error_is_tried_again_and_the_retry_is_counted():
    client, transport = scripted_client(HTTPFailure(500), answer())
    done = await client.complete(QUESTION)
    assert done.text == "fine" and done.retries == 1
    [record] = client.ledger.records
    assert record.retries == 1 and record.error is None
    assert len(transport.requests) == 2


async def test_a_rate_limit_is_waited_out_at_the_gate_and_spends_no_retry():
    client, transport = scripted_client(HTTPFailure(429, {"retry-after-ms": "20"}), answer())
    done = await client.complete(QUESTION)
    assert done.retries == 0
    [record] = client.ledger.records
    assert record.rate_limited == 1 and record.retries == 0
    assert client.gate(MODEL).rate_limited == 1


async def test_a_refusal_is_not_tried_again_and_fails_in_one_line():
    client, transport = scripted_client(HTTPFailure(400))
    with pytest.raises(LLMQueryError, match=r"^LLM call to 'openai/scripted' failed: "):
        await client.complete(QUESTION)
    assert len(transport.requests) == 1
    [record] = client.ledger.records
    assert record.error is not None


async def test_a_refused_key_is_a_setting_to_fix_not_tried_again(monkeypatch):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    client, transport = scripted_client(HTTPFailure(401), answer(), max_retries=2)
    with pytest.raises(ConfigError) as caught:
        await client.complete(QUESTION)
    assert isinstance(caught.value, APIKeyError) and isinstance(caught.value, LLMQueryError)
    assert str(caught.value) == (
        "no API key for 'openai/scripted': set OPENAI_API_KEY or %config RLM.api_key = ..."
    )
    assert len(transport.requests) == 1  # of the three attempts allowed
    [record] = client.ledger.records
    assert record.error == str(caught.value) and record.retries == 0


async def test_retries_stop_at_max_retries():
    client, transport = scripted_client(*[HTTPFailure(503)] * 3, answer(), max_retries=2)
    with pytest.raises(LLMQueryError, match="after 3 attempts"):
        await client.complete(QUESTION)
    assert len(transport.requests) == 3


async def test_a_stream_broken_off_after_text_keeps_its_text_and_is_not_asked_again():
    client, transport = scripted_client(BrokenOff("half an ans", ConnectionError("gone")))
    done = await client.complete(QUESTION, stream=True)
    assert done.text.startswith("half an ans\n[answer cut off: ")
    assert done.incomplete and done.cut_reason
    assert len(transport.requests) == 1
    [record] = client.ledger.records
    assert record.cut_off and record.cost_usd == 0.0005  # what was streamed is billed


async def test_an_answer_cut_at_max_tokens_is_marked_cut_off():
    client, _ = scripted_client(answer("short", finish_reason="length"))
    done = await client.complete(QUESTION)
    assert done.cut_off and done.incomplete


async def test_the_cache_answers_an_identical_request_without_the_transport(tmp_path):
    client, transport = scripted_client(answer("once"), cache=True, cache_dir=str(tmp_path))
    first = await client.complete(QUESTION)
    again = await client.complete(QUESTION)
    assert (first.text, again.text, again.cached) == ("once", "once", True)
    assert len(transport.requests) == 1


async def test_a_transport_given_to_the_client_takes_every_call_whatever_the_settings():
    deployment = {"model_name": MODEL, "litellm_params": {"model": "openai/elsewhere"}}
    client, transport = scripted_client(answer("mine"), model_list=[deployment])
    assert (await client.complete(QUESTION)).text == "mine"
    assert len(transport.requests) == 1


async def test_an_sdk_that_had_no_key_to_send_is_not_tried_again(monkeypatch):
    # What litellm raises when the OpenAI SDK refuses to send without a key: a "500".
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    missing = HTTPFailure(500)
    missing.args = ("InternalServerError: OpenAIException - Missing credentials. Please pass",)
    client, transport = scripted_client(missing, answer(), max_retries=2)
    with pytest.raises(APIKeyError, match=r"^no API key for 'openai/scripted': set OPENAI"):
        await client.complete(QUESTION)
    assert len(transport.requests) == 1
