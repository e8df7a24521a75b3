"""Which endpoints the wire transport serves, and where their requests go.

``route_for`` decides once per model and endpoint, with litellm's own provider
resolution, and says None for everything else, which then goes through litellm:

- ``openai/...`` and OpenAI's bare model names (``gpt-4o-mini``), at ``RLM.api_base`` (any
  OpenAI-compatible server: llama.cpp, vLLM, Ollama's ``/v1``, LM Studio...) or OpenAI's;
- ``hosted_vllm/...`` and ``litellm_proxy/...``.

Not here, through litellm: models whose request litellm rewrites (OpenAI's o-series and
gpt-5 take ``max_completion_tokens`` and refuse some parameters), Azure (deployment
URLs, api-version, AD tokens), OpenRouter (its own headers and usage options), every
other provider, and ``RLM.litellm_kwargs`` holding anything but OpenAI's own chat
parameters.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Any

from ... import environment
from ...keys import OWN_SERVER_KEYS, PUBLIC_HOMES, environment_key
from ...litellm_loader import imported_litellm

# litellm's chat configuration classes that send OpenAI's request unchanged.
_PLAIN_CONFIGS = {
    "OpenAIGPTConfig",
    "OpenAIUnknownModelConfig",
    "HostedVLLMChatConfig",
    "LiteLLMProxyChatConfig",
}
# Where each provider's endpoint and key come from when the settings leave them out
# (litellm's order: the argument, then these environment variables, then a default).
_BASES = {
    "openai": (("OPENAI_BASE_URL", "OPENAI_API_BASE"), "https://api.openai.com/v1"),
    "hosted_vllm": (("HOSTED_VLLM_API_BASE",), None),
    "litellm_proxy": (("LITELLM_PROXY_API_BASE",), None),
}
# Where their keys come from, and where each may go: ``keys.environment_key``.
_KEYS = {"openai": PUBLIC_HOMES["openai"].variables, **OWN_SERVER_KEYS}
# Request parameters OpenAI's chat API takes as they are (what may be in litellm_kwargs).
CHAT_PARAMETERS = frozenset(
    {
        "temperature",
        "top_p",
        "n",
        "stop",
        "presence_penalty",
        "frequency_penalty",
        "logit_bias",
        "seed",
        "user",
        "response_format",
        "tools",
        "tool_choice",
        "parallel_tool_calls",
        "logprobs",
        "top_logprobs",
        "store",
        "metadata",
        "prediction",
        "service_tier",
        "reasoning_effort",
        "verbosity",
        "max_tokens",
        "max_completion_tokens",
        "extra_headers",
        "extra_body",
    }
)
# What rlm-magic itself puts in a request besides the messages and parameters.
_OWN = frozenset(
    {
        "model",
        "messages",
        "timeout",
        "max_retries",
        "api_base",
        "api_key",
        "stream",
        "stream_options",
    }
)


def fits(params: dict[str, Any]) -> bool:
    """Whether a request with these extra parameters can go over the wire unchanged."""
    return all(name in CHAT_PARAMETERS or name in _OWN for name in params)


# -- routes ----------------------------------------------------------------------------


@dataclass
class Route:
    """Where one model's requests go and how they are priced."""

    model: str  # as configured, e.g. "openai/gpt-4o-mini"
    provider: str
    sent_model: str  # as the endpoint knows it, e.g. "gpt-4o-mini"
    url: str
    api_base: str
    headers: dict[str, str]
    price_names: tuple[str, ...]  # where litellm's price map may list this model
    proxy: str | None = None  # from HTTP(S)_PROXY / NO_PROXY, as litellm's clients


_ROUTES: dict[tuple[Any, ...], Route | None] = {}
# The environment a route may be read from: a change (a key set later) resolves anew.
ROUTE_ENVIRONMENT = tuple(
    name for names in (*(b for b, _ in _BASES.values()), *_KEYS.values()) for name in names
) + ("OPENAI_ORGANIZATION", "OPENAI_ORG_ID", "OPENAI_PROJECT_ID")


_environment = environment.reader(ROUTE_ENVIRONMENT)


def litellm_settings(litellm: Any) -> tuple[Any, ...] | None:
    """litellm's module-wide settings a route depends on (None: litellm not imported)."""
    if litellm is None:
        return None
    headers = getattr(litellm, "headers", None)
    return (
        getattr(litellm, "api_key", None),
        getattr(litellm, "api_base", None),
        repr(headers) if headers else None,
    )


def route_for(litellm: Any, model: str, api_base: str | None, api_key: str | None) -> Route | None:
    """The wire route for ``model`` at this endpoint, or None: litellm sends it."""
    # litellm's module-wide settings too: one set mid-session must not keep the old route.
    where = (model, api_base, api_key, litellm_settings(litellm), _environment())
    try:
        return _ROUTES[where]
    except KeyError:
        route = _ROUTES[where] = _resolve(litellm, model, api_base, api_key)
        return route


# Model names the openai provider sends through another configuration than its plain one
# (litellm's o-series, gpt-5, audio and search configs): such models need litellm.
_NOT_PLAIN_OPENAI = re.compile(r"^(?:o\d|gpt-[5-9]|.*(?:audio|search|realtime|transcribe))", re.I)


def light_route(model: str, api_base: str | None, api_key: str | None) -> Route | None:
    """The wire route for ``model`` decided without litellm (never imported here), for the
    cases whose answer is plain: ``openai/``, ``hosted_vllm/`` or ``litellm_proxy/`` with
    a name the provider sends as it stands, and no litellm module settings. None: ask
    ``route_for`` (with litellm) instead."""
    provider, _, name = model.partition("/")
    if not name or provider not in _BASES or imported_litellm() is not None:
        return None
    if provider == "openai" and _NOT_PLAIN_OPENAI.match(name):
        return None
    where = ("light", model, api_base, api_key, _environment())
    try:
        return _ROUTES[where]
    except KeyError:
        route = _ROUTES[where] = _route(model, provider, name, api_base, api_key)
        return route


def _resolve(litellm: Any, model: str, api_base: str | None, api_key: str | None) -> Route | None:
    try:
        name, provider, _, _ = litellm.get_llm_provider(model, api_base=api_base)
        from litellm.types.utils import LlmProviders
        from litellm.utils import ProviderConfigManager

        config = ProviderConfigManager.get_provider_chat_config(name, LlmProviders(provider))
    except Exception:  # noqa: BLE001 - litellm will say what is wrong, in its words
        return None
    if provider not in _BASES or type(config).__name__ not in _PLAIN_CONFIGS:
        return None
    if getattr(litellm, "api_base", None) or getattr(litellm, "headers", None):
        return None  # litellm's module-wide settings: leave those calls to litellm
    return _route(model, provider, name, api_base, api_key or getattr(litellm, "api_key", None))


def _route(
    model: str, provider: str, name: str, api_base: str | None, api_key: str | None
) -> Route | None:
    env_names, default = _BASES[provider]
    base = api_base or next((os.environ[n] for n in env_names if os.environ.get(n)), default)
    # RLM.api_key goes to the base it is set with; OPENAI_API_KEY only to OpenAI's, or
    # to the base the environment pairs with it (never to a llama.cpp, or a third party).
    key = api_key or environment_key(provider, base)
    if provider == "hosted_vllm":
        key = key or "fake-api-key"  # as litellm sends it
    if base is None or (provider == "openai" and not key and _is_openais(base)):
        return None  # (the client refuses a call to OpenAI's own API with no key first)
    # A server of the user's with no key set (llama.cpp, vLLM, LM Studio...) is sent
    # none: they take any key, or none, unless started with one (then a 401 says so).
    headers = {"Content-Type": "application/json"}
    if key:
        headers["Authorization"] = f"Bearer {key}"
    if provider == "openai":
        organization = os.environ.get("OPENAI_ORGANIZATION") or os.environ.get("OPENAI_ORG_ID")
        if organization:
            headers["OpenAI-Organization"] = organization
        if os.environ.get("OPENAI_PROJECT_ID"):
            headers["OpenAI-Project"] = os.environ["OPENAI_PROJECT_ID"]
    base = base.rstrip("/")
    price_names = (model, f"{provider}/{name}") + ((name,) if provider == "openai" else ())
    return Route(
        model,
        provider,
        name,
        base + "/chat/completions",
        base,
        headers,
        price_names,
        proxy=_proxy_for(base),
    )


def _proxy_for(url: str) -> str | None:
    """The proxy the environment names for ``url``. Read once per route: aiohttp's own
    ``trust_env`` would look it (and ~/.netrc) up in a thread on every request."""
    from urllib.parse import urlsplit
    from urllib.request import getproxies, proxy_bypass

    parts = urlsplit(url)
    proxy = getproxies().get(parts.scheme)
    if not proxy or (parts.hostname and proxy_bypass(parts.hostname)):
        return None
    return proxy


def _is_openais(base: str) -> bool:
    from urllib.parse import urlsplit

    return urlsplit(base).hostname == "api.openai.com"
