"""``RLM.model_list``: calls go through a LiteLLM Router, and everything of ours (rate
gate, cache, ledger, redaction, interrupts) keeps working through it."""

from __future__ import annotations

import asyncio

import pytest
from traitlets import TraitError

from rlm_magic import RLM, LLMQueryError
from rlm_magic.llm.litellm_loader import load_litellm

from .support import helpers, make_rlm
from .support.llm_server import FakeLLMServer

DEAD = "http://127.0.0.1:9/v1"  # nothing listens on the discard port


def deployment(group: str, model: str, api_base: str, api_key: str = "sk-deploy-1234567890"):
    return {
        "model_name": group,
        "litellm_params": {"model": model, "api_base": api_base, "api_key": api_key},
    }


def routed(model_list, **settings) -> RLM:
    defaults = dict(
        model="root",
        sub_model="sub",
        model_list=model_list,
        progress=False,
        retry_backoff=0.01,
        timeout=10,
    )
    return RLM(**{**defaults, **settings})


@pytest.fixture
def second_server():
    server = FakeLLMServer().start()
    yield server
    server.stop()


async def test_calls_go_through_the_router_to_the_group_s_deployment(server):
    rlm = routed([deployment("sub", "openai/sub-model", server.base_url)])
    assert await helpers(rlm).llm_query("hi") == "echo: hi"
    [request] = server.requests
    assert request["model"] == "sub-model"
    [record] = rlm.client.ledger.records
    assert record.model == "sub" and record.input_tokens == 10
    assert record.cost_usd is None  # litellm knows no price for it: unknown, not $0


async def test_a_router_leaves_unpriced_models_unpriced_for_everyone(server):
    routed([deployment("sub", "openai/sub-model", server.base_url)]).client.endpoint.router(
        await load_litellm()
    )
    direct = make_rlm(server)  # the same model, not routed
    await helpers(direct).llm_query("x")
    assert direct.usage().total.cost_usd is None


async def test_root_and_sub_model_on_two_endpoints(server, second_server):
    rlm = routed(
        [
            deployment("root", "openai/root-model", second_server.base_url),
            deployment("sub", "openai/sub-model", server.base_url),
        ]
    )
    second_server.script(
        "root-model", ["```repl\nanswers = llm_query_batch(['a', 'b'])\n```", "FINAL_VAR(answers)"]
    )
    result = await rlm.arun("q", context="ctx")
    assert result.success and result.final_answer == str(["echo: a", "echo: b"])
    assert {r["model"] for r in second_server.requests} == {"root-model"}
    assert {r["model"] for r in server.requests} == {"sub-model"}


@pytest.mark.slow  # litellm's Router waiting out its own retries
async def test_a_group_with_a_dead_deployment_loses_no_item(server):
    rlm = routed(
        [
            deployment("sub", "openai/sub-model", server.base_url),
            deployment("sub", "openai/sub-model", DEAD),
        ],
        max_concurrency=16,
    )
    answers = await helpers(rlm).llm_query_batch([f"p{i}" for i in range(32)])
    assert answers == [f"echo: p{i}" for i in range(32)]


async def test_a_router_attempt_that_times_out_is_retried_before_our_stall_watch_gives_up(
    server,
):
    # The Router times each attempt out at RLM.timeout and tries again (another
    # deployment, if the group has one): a stream that opens only after that has not
    # stalled, and must not be given up at RLM.timeout.
    rlm = routed([deployment("sub", "openai/sub-model", server.base_url)], timeout=2)
    server.fail("hang", times=1)
    assert await helpers(rlm).llm_query("x") == "echo: x"
    assert len(server.requests) == 2


@pytest.mark.slow  # litellm's Router waiting out its own retries
async def test_a_deployment_refusing_connections_costs_no_item_even_before_its_cooldown(
    server,
):
    # A refused connection reached no server: the Router is asked again, without
    # spending a retry, however often its shuffle picks the dead deployment first.
    rlm = routed(
        [
            deployment("sub", "openai/sub-model", server.base_url),
            deployment("sub", "openai/sub-model", DEAD),
        ],
        max_retries=0,
        max_concurrency=16,
    )
    answers = await helpers(rlm).llm_query_batch([f"p{i}" for i in range(32)])
    assert answers == [f"echo: p{i}" for i in range(32)]
    assert rlm.usage().total.errors == 0


@pytest.mark.slow  # litellm's Router waiting out its own retries
async def test_a_group_whose_deployments_all_refuse_fails_at_once_in_one_line():
    rlm = routed([deployment("sub", "openai/sub-model", DEAD), deployment("sub", "openai/b", DEAD)])
    with pytest.raises(LLMQueryError, match=r"could not reach http://127.0.0.1:9/v1") as caught:
        await asyncio.wait_for(helpers(rlm).llm_query("x"), 30)
    assert "\n" not in str(caught.value)


@pytest.mark.slow  # litellm's Router waiting out its own retries
async def test_the_router_retries_and_we_do_not_retry_on_top(server):
    rlm = routed([deployment("sub", "openai/sub-model", server.base_url)], max_retries=2)
    server.fail("500", times=5)
    with pytest.raises(LLMQueryError, match="injected server error"):
        await helpers(rlm).llm_query("x")
    assert len(server.requests) == 3  # the Router's 1 + 2, not 3 x 3


async def test_a_429_through_the_router_is_waited_out(server):
    rlm = routed([deployment("sub", "openai/sub-model", server.base_url)], max_retries=0)
    server.fail("429", times=2, headers={"retry-after-ms": "50"})
    assert await helpers(rlm).llm_query("x") == "echo: x"
    assert rlm.usage().total.rate_limited == 2 and rlm.usage().total.errors == 0


async def test_an_unknown_group_is_one_clear_line(server):
    rlm = routed([deployment("sub", "openai/sub-model", server.base_url)])
    with pytest.raises(LLMQueryError) as caught:
        await helpers(rlm).llm_query("x", model="gpt-5")
    assert "'gpt-5' is not a model group of RLM.model_list (its groups: sub)" in str(caught.value)
    assert "\n" not in str(caught.value) and not server.requests


def test_a_malformed_model_list_is_refused_in_one_line():
    with pytest.raises(TraitError, match=r"RLM.model_list\[0\] needs 'litellm_params'"):
        RLM(model_list=[{"model_name": "sub"}])
    with pytest.raises(TraitError, match="needs a 'model_name'"):
        RLM(model_list=[{"litellm_params": {"model": "x"}}])


def test_settings_mask_the_keys_inside_the_model_list():
    rlm = routed([deployment("sub", "openai/x", DEAD, api_key="sk-live-abcdefghijklmnop")])
    shown = rlm.settings()["model_list"][0]["litellm_params"]
    assert shown["api_key"] == "sk-...mnop" and shown["api_base"] == DEAD
    assert rlm.model_list[0]["litellm_params"]["api_key"] == "sk-live-abcdefghijklmnop"


async def test_keys_in_the_model_list_never_reach_a_model(server):
    key = "sk-live-abcdefghijklmnop"
    rlm = routed([deployment("sub", "openai/sub-model", server.base_url, api_key=key)])
    assert await helpers(rlm).llm_query(f"my key is {key}") == "echo: my key is [REDACTED]"


def test_configured_secrets_include_nested_headers_and_environment_references(monkeypatch):
    monkeypatch.setenv("DEPLOY_KEY_VAR", "sk-from-the-environment-123")
    rlm = routed(
        [
            {
                "model_name": "sub",
                "litellm_params": {"model": "openai/x", "api_key": "os.environ/DEPLOY_KEY_VAR"},
            }
        ],
        litellm_kwargs={
            "extra_headers": {"Authorization": "Bearer tok-header-789"},
            "temperature": 0,
        },
    )
    assert set(rlm.configured_secrets()) == {"sk-from-the-environment-123", "Bearer tok-header-789"}


async def test_the_cache_answers_a_routed_call_again_at_no_cost(server, tmp_path):
    rlm = routed(
        [deployment("sub", "openai/sub-model", server.base_url)],
        cache=True,
        cache_dir=str(tmp_path),
    )
    await helpers(rlm).llm_query("same")
    await helpers(rlm).llm_query("same")
    assert len(server.requests) == 1 and rlm.usage().total.cache_hits == 1


async def test_cancelling_a_routed_batch_leaves_nothing_in_flight(server):
    rlm = routed([deployment("sub", "openai/sub-model", server.base_url)])
    server.latency = 30
    task = asyncio.ensure_future(helpers(rlm).llm_query_batch([f"p{i}" for i in range(6)]))
    assert await asyncio.to_thread(server.wait_for, lambda: server.in_flight == 6)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert await asyncio.to_thread(server.wait_for, lambda: server.in_flight == 0)


def test_a_cost_the_proxy_reports_prices_a_model_litellm_cannot():
    from types import SimpleNamespace

    from rlm_magic.llm.pricing import cost_of_response as _cost_of

    class Unpriced:  # litellm's pricing fails for a name it does not know
        @staticmethod
        def completion_cost(completion_response):
            raise ValueError("model not mapped")

    reported = SimpleNamespace(
        _hidden_params={"additional_headers": {"llm_provider-x-litellm-response-cost": "0.0042"}}
    )
    assert _cost_of(reported, Unpriced) == 0.0042
    assert _cost_of(SimpleNamespace(_hidden_params={}), Unpriced) is None


async def test_a_key_a_deployment_has_refused_is_one_line_after_one_request(server):
    from rlm_magic import APIKeyError

    server.fail("401", times=10)
    rlm = routed([deployment("sub", "openai/sub-model", server.base_url)], max_retries=2)
    with pytest.raises(APIKeyError) as caught:
        await helpers(rlm).llm_query("x")
    message = str(caught.value)
    assert message.startswith("the API key from RLM.model_list was refused for 'sub' (401: ")
    assert message.endswith("): fix the deployments' api_key")
    assert "injected bad API key" in message and "sk-deploy" not in message
    assert len(server.requests) == 1  # neither the Router nor the client tried again


async def test_a_keyless_local_server_behind_the_router_answers_with_no_key_set(
    server, monkeypatch
):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    rlm = routed([deployment("sub", "openai/sub-model", server.base_url, api_key=None)])
    assert await helpers(rlm).llm_query("hi") == "echo: hi"


def test_a_group_is_held_at_its_dearest_deployment_s_rates_its_own_price_first():
    from rlm_magic.llm.pricing import highest_rates
    from rlm_magic.llm.transports.router import group_rates

    own = deployment("sub", "openai/gpt-4o", DEAD)
    own["litellm_params"]["input_cost_per_token"] = 1e-3  # (its output: gpt-4o's)
    mapped = deployment("sub", "openai/gpt-4o-mini", DEAD)
    gpt_4o = highest_rates(None, "openai/gpt-4o")
    assert gpt_4o is not None
    assert group_rates(None, [own, mapped], "sub") == (1e-3, gpt_4o[1])
    unpriced = deployment("sub", "openai/my-own-model", DEAD)
    assert group_rates(None, [own, unpriced], "sub") is None
    assert group_rates(None, [own], "another group") is None
