"""API keys: a missing one is found before anything is sent, a rejected one is said once.

- ``missing_key``: no key for a model whose provider needs one (none in ``RLM.api_key``,
  none in the environment variables litellm reads for it, none in litellm's own module
  settings): an ``APIKeyError`` before any request, so nothing is sent, retried or paid.
  litellm's ``validate_environment`` says which variables a model needs; only providers
  whose one credential is an API key are checked (AWS, Azure AD, Vertex's credentials
  and the like have other sources litellm looks up itself).
- ``keyless``: an OpenAI-compatible server at an ``api_base`` of the user's (llama.cpp,
  vLLM, LM Studio, Ollama's ``/v1``) is sent no key when none is set; such a server
  takes any key, or none, unless it was started with one (``--api-key``).
- ``key_failure``: a failed attempt that means the key is missing or wrong (a 401, an
  ``AuthenticationError``, an SDK's "Missing credentials") becomes an ``APIKeyError``,
  never retried: the same key would be refused again.
"""

from __future__ import annotations

import functools
import os
import re
import types
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from ..errors import APIKeyError, describe_exception

if TYPE_CHECKING:
    from ..config import RLMConfig

# Providers whose requests go to an OpenAI-compatible server at the api_base.
OPENAI_COMPATIBLE = ("openai", "hosted_vllm", "litellm_proxy", "custom_openai")
# What a keyless OpenAI-compatible server is sent through litellm, whose OpenAI SDK
# refuses to send a request without a key (the wire transport sends none at all).
PLACEHOLDER_KEY = "no-key-required"
# Environment variables that hold an API key (not AWS's, Azure's or Vertex's others).
_KEY_VARIABLE = re.compile(r"_(?:API_KEY|API_TOKEN|AUTH_TOKEN)$")
_OPENAI_BASES = ("OPENAI_BASE_URL", "OPENAI_API_BASE")
# What SDKs and litellm say when they had no key to send (not an HTTP answer).
_NO_KEY_SENTENCE = re.compile(
    r"missing credentials|api_key client option must be set|"
    r"missing [\w ]{0,30}api[ _-]?key|no api key (?:was )?(?:provided|found|set)",
    re.IGNORECASE,
)
_OPENAI_HOST = "api.openai.com"


@functools.lru_cache(maxsize=256)
def provider_of(litellm: Any, model: str, api_base: str | None = None) -> str | None:
    """litellm's provider of ``model`` (once per model and endpoint: ~40 us each)."""
    try:
        provider: str = litellm.get_llm_provider(model, api_base=api_base)[1]
    except Exception:  # noqa: BLE001 - a model litellm does not know: litellm will say
        return None
    return provider


@functools.lru_cache(maxsize=64)
def _openais(base: str) -> bool:
    return urlsplit(base).hostname == _OPENAI_HOST


def own_base(config: RLMConfig, provider: str | None) -> str | None:
    """The user's own endpoint for this provider, if any: ``RLM.api_base``, or for
    OpenAI's provider ``OPENAI_BASE_URL``; OpenAI's own address is none."""
    base = config.api_base
    if not base and provider == "openai":
        base = next((os.environ[n] for n in _OPENAI_BASES if os.environ.get(n)), None)
    if not base or _openais(base):
        return None
    return base


def keyless(litellm: Any, config: RLMConfig, model: str) -> bool:
    """Whether ``model`` goes to an OpenAI-compatible server of the user's with no key
    anywhere: it is sent none (through litellm, a placeholder the server ignores)."""
    if config.api_key:
        return False
    provider = provider_of(litellm, model, config.api_base)
    return (
        provider in OPENAI_COMPATIBLE
        and own_base(config, provider) is not None
        and not _key_set(litellm, config, provider, model)
    )


def missing_key(litellm: Any, config: RLMConfig, model: str) -> APIKeyError | None:
    """An ``APIKeyError`` when ``model`` needs a key and none is set anywhere."""
    if config.api_key:
        return None  # (every call asks: the usual answer costs nothing)
    provider = provider_of(litellm, model, config.api_base)
    if provider is None or own_base(config, provider) is not None:
        return None  # a server of the user's decides for itself (a 401 says it)
    if _key_set(litellm, config, provider, model):
        return None
    try:
        missing = litellm.validate_environment(model)["missing_keys"]
    except Exception:  # noqa: BLE001 - litellm will say what is missing when it sends
        return None
    if not missing or not all(_KEY_VARIABLE.search(name) for name in missing):
        return None  # no key needed, or credentials of another kind (AWS, Azure, Vertex)
    return APIKeyError.missing(model, missing)


def may_be_key_failure(failure: BaseException) -> bool:
    """Whether ``failure`` may stand for a key refused or missing (see ``key_failure``)."""
    return (
        getattr(failure, "status_code", None) == 401
        or type(failure).__name__ == "AuthenticationError"
        or bool(_NO_KEY_SENTENCE.search(str(failure)))
    )


def key_failure(
    failure: BaseException, litellm: Any, config: RLMConfig, model: str, routed: bool = False
) -> APIKeyError | None:
    """The ``APIKeyError`` a failed attempt stands for: a 401, an authentication error,
    or an SDK that had no key to send; None for any other failure."""
    status = getattr(failure, "status_code", None)
    text = str(failure)
    said = describe_exception(failure)  # the provider's sentence, once
    kind = f"{type(failure).__name__}: "
    said = f"{status}: {said[len(kind) :]}" if said.startswith(kind) and status else said
    refused = status == 401 or type(failure).__name__ == "AuthenticationError"
    unsent = bool(_NO_KEY_SENTENCE.search(text))
    if not (refused or unsent):
        return None  # (a LiteLLM Proxy's 400 "No connected db": see call.py)
    if routed and unsent and not refused:
        return APIKeyError(
            model,
            f"no API key for a deployment of {model!r}: set its api_key in RLM.model_list "
            "(or the provider's environment variable)",
            failure,
        )
    if routed:
        return APIKeyError.rejected(model, failure, said, "RLM.model_list")
    provider = provider_of(litellm, model, config.api_base)
    names = key_variables(litellm, model)
    source = _key_source(litellm, config, provider, model, names)
    if source is None or (unsent and not refused):
        return APIKeyError.missing(model, names, sent_to=own_base(config, provider), cause=failure)
    return APIKeyError.rejected(model, failure, said, source, names)


@functools.lru_cache(maxsize=128)
def _variables(validate: Any, model: str) -> tuple[str, ...]:
    # litellm's check reads ``os.environ``: the same code, given an empty environment,
    # lists every variable it looks for (a copy of its globals; nothing is changed).
    check = types.FunctionType(
        validate.__code__,
        {**validate.__globals__, "os": types.SimpleNamespace(environ={})},
        validate.__name__,
        validate.__defaults__,
        validate.__closure__,
    )
    found = check(model)["missing_keys"]
    return tuple(name for name in found if _KEY_VARIABLE.search(name))


def key_variables(litellm: Any, model: str) -> tuple[str, ...]:
    """The environment variables litellm reads ``model``'s key from (e.g.
    ``("OPENAI_API_KEY",)``), whether or not they are set."""
    try:
        return _variables(litellm.validate_environment, model)
    except Exception:  # noqa: BLE001 - another litellm: name no variable
        return ()


def _key_set(litellm: Any, config: RLMConfig, provider: str | None, model: str) -> bool:
    return _key_source(litellm, config, provider, model, key_variables(litellm, model)) is not None


def _key_source(
    litellm: Any, config: RLMConfig, provider: str | None, model: str, names: tuple[str, ...]
) -> str | None:
    """Where the key a call sends comes from: ``RLM.api_key``, a variable's name,
    litellm's module settings, a header in ``litellm_kwargs``; None: nowhere."""
    if config.api_key:
        return "RLM.api_key"
    for name in names:
        if os.environ.get(name):
            return name
    if provider == "anthropic" and os.environ.get("ANTHROPIC_AUTH_TOKEN"):
        return "ANTHROPIC_AUTH_TOKEN"
    for setting in ("api_key", f"{provider}_key"):
        if getattr(litellm, setting, None):
            return f"litellm.{setting}"
    headers = config.litellm_kwargs.get("extra_headers") or {}
    if isinstance(headers, dict) and any(
        n.lower() in ("authorization", "api-key", "x-api-key") for n in headers
    ):
        return "RLM.litellm_kwargs' extra_headers"
    return None
