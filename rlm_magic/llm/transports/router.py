"""Routing through a LiteLLM Router: ``RLM.model_list`` and ``RLM.router_settings``.

With a model list, ``model`` and ``sub_model`` name model groups, and each call goes
through ``Router.acompletion`` on the kernel's loop: the Router picks a deployment (a
key, a region, an endpoint per model) and fails over between a group's deployments.

Who retries: the Router, because only it knows which deployment failed and can try
another; it gets ``RLM.max_retries`` as its ``num_retries``, and rlm-magic adds no
retries of its own on top (3 x 3 attempts would hide a dead group for minutes). Only a
refused connection (nothing sent, a millisecond lost) is handed to the Router again,
a few times, because until its cooldown the Router may pick the refusing deployment
for every attempt of a call. A 429 that the Router could not route around still reaches
our rate gate and is waited out like any other. Everything else of ours (the limiter,
cache, ledger, redaction, interrupts) is unchanged. Where the client's calls go with a
model list, and how they are retried, is ``endpoints.RouterEndpoint``'s.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from ..keys import PLACEHOLDER_KEY, environment_key
from ..pricing import highest_rates
from .litellm import LiteLLMTransport


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
    router = litellm.Router(model_list=[_keyed(entry) for entry in model_list], **settings)
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
