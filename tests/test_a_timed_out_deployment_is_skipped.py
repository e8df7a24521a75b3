"""Through a Router, a deployment whose call timed out is skipped for its cool-down: a
hanging deployment costs one RLM.timeout, not one per call (litellm's default cools a
deployment down on a timeout only among many failures)."""

from __future__ import annotations

import asyncio
import time

import pytest

from rlm_magic import RLM
from rlm_magic.llm.transports.router import TIMEOUT_COOLS_DOWN, for_the_router

from .support import helpers

# Generous: a loaded machine takes seconds to send a Router's first request.
TIMEOUT, COOL_DOWN = 4.0, 10.0


def _deployment(model: str, api_base: str, weight: float, **info) -> dict:
    params = {"model": model, "api_base": api_base, "api_key": "sk-deploy-1234567890"}
    entry = {"model_name": "sub", "litellm_params": {**params, "weight": weight}}
    return {**entry, "model_info": info} if info else entry


@pytest.mark.slow  # a real timeout and a cool-down: 20 s
async def test_after_a_timeout_calls_go_to_the_healthy_deployment_until_the_cool_down_ends(
    server,
):
    # The Router picks by weight: the hanging deployment every time it may (the healthy
    # one weighs nothing), so a call reaches the healthy one only while the other is
    # cooled down. It hangs once, then answers (so its return costs no timeout).
    server.fail("hang", times=1, model="hang-model")
    rlm = RLM(
        model="root",
        sub_model="sub",
        model_list=[
            _deployment("openai/hang-model", server.base_url, 1.0),
            _deployment("openai/sub-model", server.base_url, 0.0),
        ],
        router_settings={"cooldown_time": COOL_DOWN},
        progress=False,
        retry_backoff=0.01,
        timeout=TIMEOUT,
        max_retries=3,
    )
    query = helpers(rlm).llm_query

    def hangs() -> int:
        return sum(request["model"] == "hang-model" for request in server.requests)

    started = time.monotonic()
    # The hang's timeout, the Router's backoff, then the healthy deployment.
    assert await query("first") == "echo: first"
    first_answered = time.monotonic()
    assert hangs() == 1
    # The cool-down began at the timeout, no sooner than TIMEOUT after the start.
    cooled_until = started + TIMEOUT + COOL_DOWN
    within = 0
    for n in range(4):
        began = time.monotonic()
        assert await query(f"p{n}") == f"echo: p{n}"
        ended = time.monotonic()
        if ended < cooled_until:
            within += 1
            assert hangs() == 1, n  # not even sent to the deployment cooling down
            assert ended - began < TIMEOUT, n
    assert within >= 1, "no call finished within the cool-down: a very slow machine"
    # Once the cool-down has ended (it began before the first call answered), the
    # deployment is picked again.
    await asyncio.sleep(max(0.0, first_answered + COOL_DOWN + 0.5 - time.monotonic()))
    assert await query("later") == "echo: later"
    assert hangs() == 2


def test_only_groups_of_several_without_allowed_fails_of_the_users_get_the_policy():
    def entry(group: str, **info) -> dict:
        params = {"model": "openai/m", "api_base": "http://x/v1", "api_key": "sk-1234567890"}
        return {
            "model_name": group,
            "litellm_params": params,
            **({"model_info": info} if info else {}),
        }

    model_list = [
        entry("pair"),
        entry("pair", team="a"),
        entry("one"),
        entry("own"),
        entry("own", allowed_fails=9),
    ]
    routed = for_the_router(model_list, {})
    policies = [(e.get("model_info") or {}).get("allowed_fails_policy") for e in routed]
    assert policies == [TIMEOUT_COOLS_DOWN, TIMEOUT_COOLS_DOWN, None, TIMEOUT_COOLS_DOWN, None]
    assert routed[1]["model_info"]["team"] == "a"
    assert "model_info" not in model_list[0]  # the user's list is left as it was
    for setting in ({"allowed_fails": 1}, {"allowed_fails_policy": {}}):
        routed = for_the_router(model_list, setting)
        assert not any("allowed_fails_policy" in (e.get("model_info") or {}) for e in routed)
