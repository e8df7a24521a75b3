"""Routing through a LiteLLM Router: ``RLM.model_list`` and ``RLM.router_settings``.

With a model list, ``model`` and ``sub_model`` name model groups, and each call goes
through ``Router.acompletion`` on the kernel's loop: the Router picks a deployment (a
key, a region, an endpoint per model) and fails over between a group's deployments.

Who retries: the Router, because only it knows which deployment failed and can try
another; it gets ``RLM.max_retries`` as its ``num_retries``, and rlm-magic adds no
retries of its own on top (3 x 3 attempts would hide a dead group for minutes). Only a
refused connection (nothing sent, a millisecond lost) is handed to the Router again,
a few times, because until its cooldown the Router may pick the refusing deployment
for every attempt of a call. A deployment whose call timed out is skipped for its
cool-down, as one answering 429 is (``TIMEOUT_COOLS_DOWN``: litellm's default counts a
timeout only among many failures). A 429 that the Router could not route around still
reaches our rate gate and is waited out like any other. Everything else of ours (the
limiter, cache, ledger, redaction, interrupts) is unchanged. Where the client's calls
go with a model list, and how they are retried, is ``endpoints.RouterEndpoint``'s.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from ..keys import PLACEHOLDER_KEY, environment_key
from ..pricing import highest_rates
from .litellm import LiteLLMTransport

# A deployment's fails of each type allowed before its cool-down (litellm's
# ``allowed_fails_policy``, in its ``model_info``), given to each deployment of a group
# of several. litellm's default cool-down (its "v2") skips a deployment at once on a 429,
# 401 or 404, but on a timeout only once more than half of a minute's calls to it failed,
# five calls at least: a hanging deployment was picked again and again, each time costing
# a whole RLM.timeout. A policy is litellm's way to say otherwise: no timeout allowed.
# Its other entries keep what v2 did, since a deployment with a policy has every error
# the policy does not name counted against the Router's ``allowed_fails`` (3) instead.
# Not in a group of one: cooling down its only deployment would fail the group's calls
# for the cool-down, where a retry may well be answered. Not where the user set any
# allowed fails of their own (``router_settings`` or the deployment's ``model_info``).
TIMEOUT_COOLS_DOWN = {
    "TimeoutErrorAllowedFails": 0,
    "RateLimitErrorAllowedFails": 0,
    "AuthenticationErrorAllowedFails": 0,
    "NotFoundErrorAllowedFails": 0,
}
_USERS_OWN_FAILS = ("allowed_fails", "allowed_fails_policy")


class RouterTransport(LiteLLMTransport):
    """``Router.acompletion``, read as litellm's own answers are."""

    name = "router"
    shares_sessions = False


def groups(model_list: list[dict[str, Any]]) -> list[str]:
    return sorted({entry["model_name"] for entry in model_list})


def deployments(model_list: list[dict[str, Any]], group: str) -> list[str]:
    """The litellm model strings behind a group (what litellm's model info knows)."""
    return [
        str(entry.get("litellm_params", {}).get("model"))
        for entry in model_list
        if entry.get("model_name") == group and entry.get("litellm_params", {}).get("model")
    ]


def group_rates(
    litellm: Any, model_list: list[dict[str, Any]], group: str
) -> tuple[float, float] | None:
    """Dollars per input and output token a call to ``group`` may be charged at most:
    the highest of its deployments' rates, each deployment's own price (in its
    ``litellm_params``, which the Router bills at) before its model's. None when one
    has no price."""
    found: list[tuple[float, float]] = []
    for entry in model_list:
        if entry.get("model_name") != group:
            continue
        params = entry.get("litellm_params") or {}
        own_in, own_out = params.get("input_cost_per_token"), params.get("output_cost_per_token")
        if isinstance(own_in, (int, float)) and isinstance(own_out, (int, float)):
            found.append((float(own_in), float(own_out)))
            continue
        # A rate it does not give is its model's.
        known = highest_rates(litellm, str(params.get("model")))
        if known is None:
            return None
        found.append(
            (
                float(own_in) if isinstance(own_in, (int, float)) else known[0],
                float(own_out) if isinstance(own_out, (int, float)) else known[1],
            )
        )
    if not found:
        return None
    return max(rates[0] for rates in found), max(rates[1] for rates in found)


def identity(model_list: list[dict[str, Any]], router_settings: dict[str, Any]) -> str:
    """A short, stable name for one configuration (for rate gates and cache keys)."""
    text = json.dumps([model_list, router_settings], sort_keys=True, default=str)
    return "router:" + hashlib.sha256(text.encode()).hexdigest()[:12]


def build_router(
    litellm: Any,
    model_list: list[dict[str, Any]],
    router_settings: dict[str, Any],
    *,
    num_retries: int,
    timeout: float,
) -> Any:
    """A Router for this configuration; ``router_settings`` win over our defaults."""
    settings = {"num_retries": num_retries, "timeout": timeout, **router_settings}
    known = set(litellm.model_cost)
    router = litellm.Router(model_list=for_the_router(model_list, router_settings), **settings)
    # The Router enters each deployment's model into litellm's process-wide price map,
    # without a price when litellm knows none: every later call to that model, routed or
    # not, would then be priced at a false $0 instead of unknown.
    models = {entry["litellm_params"]["model"] for entry in model_list}
    for name in (set(litellm.model_cost) - known) & models:
        entry = litellm.model_cost[name]
        if not any(
            "cost" in key and isinstance(value, (int, float)) for key, value in entry.items()
        ):
            del litellm.model_cost[name]
    return router


def for_the_router(
    model_list: list[dict[str, Any]], router_settings: dict[str, Any]
) -> list[dict[str, Any]]:
    """The model list as the Router gets it: each deployment keyed (``_keyed``), and
    each of a group of several cooled down after one timeout (``TIMEOUT_COOLS_DOWN``)
    unless the user set allowed fails."""
    entries = [_keyed(entry) for entry in model_list]
    if any(name in router_settings for name in _USERS_OWN_FAILS):
        return entries
    sizes: dict[str, int] = {}
    for entry in entries:
        sizes[entry["model_name"]] = sizes.get(entry["model_name"], 0) + 1
    for at, entry in enumerate(entries):
        info = entry.get("model_info") or {}
        if sizes[entry["model_name"]] > 1 and not any(name in info for name in _USERS_OWN_FAILS):
            policy = {"allowed_fails_policy": dict(TIMEOUT_COOLS_DOWN)}
            entries[at] = {**entry, "model_info": {**info, **policy}}
    return entries


def _keyed(entry: dict[str, Any]) -> dict[str, Any]:
    """A deployment as the Router gets it: an OpenAI-compatible server of the user's
    (an ``openai/`` model at an ``api_base``) with no key anywhere gets a placeholder,
    which such servers ignore; litellm's OpenAI client sends nothing without a key."""
    params = entry.get("litellm_params") or {}
    if (
        str(params.get("model", "")).startswith("openai/")
        and params.get("api_base")
        and not params.get("api_key")
        and environment_key("openai", params["api_base"]) is None  # (none it may carry)
    ):
        return {**entry, "litellm_params": {**params, "api_key": PLACEHOLDER_KEY}}
    return dict(entry)
