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

Where a key may go (``environment_key``, ``sent_key``, ``litellm_api_key``): a key
from the environment goes where its name says and no further. A public service's key
(``OPENAI_API_KEY``) goes to that service, or to the base the environment pairs with
it (``OPENAI_BASE_URL``), never to another ``api_base`` (a llama.cpp, a third party's
host); a key named for a server of the user's own (``HOSTED_VLLM_API_KEY``) goes to
the ``api_base`` in use. ``RLM.api_key`` goes to the ``api_base`` it is set with, or,
with none, to one provider only (``api_key_across_providers``).

Why one module: whether a key is missing, where it may be sent and what a refusal of it
means are read from the same facts (the provider litellm names, the ``api_base``, the
variable a key came from), and must agree: a key judged present here is the key sent.
"""

from __future__ import annotations

import functools
import os
import re
import types
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from ..errors import APIKeyError, describe_exception
from .redaction import Redactor, redact_causes

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
    """Whether ``model``'s calls carry no key: they go to an OpenAI-compatible server of
    the user's with no key anywhere, or to an api_base the environment's key must not
    go to (``foreign_home``). Sent none (through litellm, a placeholder: its clients
    send nothing without a key, and read the environment's when given none)."""
    if config.api_key:
        return False
    if _withheld_home(litellm, config, model) is not None:
        return True
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
        getattr(failure, "status_code", None) in (401, 403)  # (a 403: see _withheld_failure)
        or type(failure).__name__ == "AuthenticationError"
        or bool(_NO_KEY_SENTENCE.search(str(failure)))
    )


def key_failure(
    failure: BaseException, litellm: Any, config: RLMConfig, model: str, routed: bool = False
) -> APIKeyError | None:
    """The ``APIKeyError`` a failed attempt stands for: a 401, an authentication error,
    or an SDK that had no key to send; None for any other failure."""
    status = getattr(failure, "status_code", None)
    # Redacted before it is described: the description cuts a long sentence, and a key
    # cut in two (or its base64, its hex) would be found by neither half.
    redact_causes(failure, Redactor(extra=config.configured_secrets()))
    text = str(failure)
    said = describe_exception(failure)  # the provider's sentence, once
    kind = f"{type(failure).__name__}: "
    said = f"{status}: {said[len(kind) :]}" if said.startswith(kind) and status else said
    refused = status == 401 or type(failure).__name__ == "AuthenticationError"
    unsent = bool(_NO_KEY_SENTENCE.search(text))
    if not routed and (refused or status == 403):
        held = _withheld_failure(failure, litellm, config, model)
        if held is not None:
            return held
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
        if foreign_home(provider, config.api_base) is not None:
            names = ()  # its variables' key would not be sent there: RLM.api_key would
        return APIKeyError.missing(model, names, sent_to=own_base(config, provider), cause=failure)
    return APIKeyError.rejected(model, failure, said, source, names)


def _withheld_failure(
    failure: BaseException, litellm: Any, config: RLMConfig, model: str
) -> APIKeyError | None:
    """A 401 or 403 from a server that was not sent the environment's key (see
    ``foreign_home``): say so, and how to send it there, in one line."""
    name = withheld_variable(litellm, config, model)
    home = _withheld_home(litellm, config, model)
    if name is None or home is None:
        return None
    base = config.api_base or getattr(litellm, "api_base", None)
    return APIKeyError(
        model,
        f"{name} was not sent to {base} (not {home.owner}'s); if this server wants it: "
        f"%config RLM.api_key = os.environ['{name}']",
        failure,
    )


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
    # (litellm's check lists no variable for a vLLM server's or a proxy's key)
    for name in (*names, *OWN_SERVER_KEYS.get(provider or "", ())):
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


# -- where a key from the environment may go -------------------------------------------


@dataclass(frozen=True)
class PublicHome:
    """A public service whose key litellm reads from the environment."""

    owner: str  # as the user knows it: "OpenAI"
    host: str  # its API's host
    variables: tuple[str, ...]  # where litellm reads its key
    bases: tuple[str, ...]  # variables that pair another base with that key


_OPENAI = PublicHome(
    "OpenAI", _OPENAI_HOST, ("OPENAI_API_KEY",), ("OPENAI_BASE_URL", "OPENAI_API_BASE")
)
_COHERE = PublicHome(
    "Cohere", "api.cohere.com", ("COHERE_API_KEY", "CO_API_KEY"), ("COHERE_API_BASE",)
)
# Providers whose environment key belongs to a public service: it is sent to that
# service's host, or to the base the environment pairs with it, and held back from any
# other api_base (a llama.cpp, a third party's host). Not listed: keys that belong to a
# resource of the user's at whatever base it has (Azure's, Bedrock's, Vertex's).
PUBLIC_HOMES: dict[str, PublicHome] = {
    "openai": _OPENAI,
    "text-completion-openai": _OPENAI,  # (litellm reads OPENAI_API_KEY for both)
    "custom_openai": _OPENAI,
    "anthropic": PublicHome(
        "Anthropic",
        "api.anthropic.com",
        ("ANTHROPIC_API_KEY", "ANTHROPIC_AUTH_TOKEN"),
        ("ANTHROPIC_API_BASE", "ANTHROPIC_BASE_URL"),
    ),
    "gemini": PublicHome(
        "Google AI Studio",
        "generativelanguage.googleapis.com",
        ("GEMINI_API_KEY", "GOOGLE_API_KEY"),  # (litellm takes either)
        ("GEMINI_API_BASE",),
    ),
    "mistral": PublicHome("Mistral", "api.mistral.ai", ("MISTRAL_API_KEY",), ("MISTRAL_API_BASE",)),
    "groq": PublicHome("Groq", "api.groq.com", ("GROQ_API_KEY",), ("GROQ_API_BASE",)),
    "deepseek": PublicHome(
        "DeepSeek", "api.deepseek.com", ("DEEPSEEK_API_KEY",), ("DEEPSEEK_API_BASE",)
    ),
    "openrouter": PublicHome(
        "OpenRouter", "openrouter.ai", ("OPENROUTER_API_KEY",), ("OPENROUTER_API_BASE",)
    ),
    "xai": PublicHome("xAI", "api.x.ai", ("XAI_API_KEY",), ("XAI_API_BASE",)),
    "together_ai": PublicHome(
        "Together AI",
        "api.together.xyz",
        ("TOGETHERAI_API_KEY", "TOGETHER_AI_API_KEY", "TOGETHER_API_KEY", "TOGETHER_AI_TOKEN"),
        ("TOGETHER_AI_API_BASE",),
    ),
    "fireworks_ai": PublicHome(
        "Fireworks AI",
        "api.fireworks.ai",
        ("FIREWORKS_API_KEY", "FIREWORKS_AI_API_KEY", "FIREWORKSAI_API_KEY", "FIREWORKS_AI_TOKEN"),
        ("FIREWORKS_API_BASE", "FIREWORKS_AI_API_BASE"),
    ),
    "perplexity": PublicHome(
        "Perplexity",
        "api.perplexity.ai",
        ("PERPLEXITYAI_API_KEY", "PERPLEXITY_API_KEY"),
        ("PERPLEXITY_API_BASE",),
    ),
    "cohere": _COHERE,
    "cohere_chat": _COHERE,  # (litellm's two names for it: cohere/ models are either)
    "cerebras": PublicHome("Cerebras", "api.cerebras.ai", ("CEREBRAS_API_KEY",), ()),
}
# Keys named for a server of the user's own (there is no public vLLM or LiteLLM Proxy
# they could belong to): sent to the api_base in use, as litellm sends them.
OWN_SERVER_KEYS: dict[str, tuple[str, ...]] = {
    "hosted_vllm": ("HOSTED_VLLM_API_KEY",),
    "litellm_proxy": ("LITELLM_PROXY_API_KEY",),
}


# Every variable that decides which key goes where: the keys, and the bases paired
# with them (what a call's plan is kept under, with the routes' own).
KEY_ENVIRONMENT = tuple(
    dict.fromkeys(
        [
            *(n for home in PUBLIC_HOMES.values() for n in (*home.variables, *home.bases)),
            *(n for names in OWN_SERVER_KEYS.values() for n in names),
        ]
    )
)


# Prefixes read as providers without litellm (a name like "meta-llama/x" is no provider).
_PREFIXES_WITHOUT_LITELLM = frozenset(
    {*PUBLIC_HOMES, *OPENAI_COMPATIBLE, "azure", "ollama", "ollama_chat", "vertex_ai", "bedrock"}
)


def foreign_home(provider: str | None, api_base: str | None) -> PublicHome | None:
    """The public service whose environment key a request of ``provider``'s must not
    carry to ``api_base``; None where it may (its home, the base the environment pairs
    with it, no api_base: the provider's default) or the provider has no such key."""
    home = PUBLIC_HOMES.get(provider or "")
    if home is None or not api_base or _home_or_paired(home, api_base):
        return None
    return home


def environment_key(provider: str | None, api_base: str | None) -> str | None:
    """The key from the environment a request of ``provider``'s to ``api_base``
    carries: None where it must not go there (see ``foreign_home``) or none is set."""
    if foreign_home(provider, api_base) is not None:
        return None
    home = PUBLIC_HOMES.get(provider or "")
    names = home.variables if home else OWN_SERVER_KEYS.get(provider or "", ())
    return next((os.environ[n] for n in names if os.environ.get(n)), None)


def sent_key(model: str, api_base: str | None, api_key: str | None) -> str | None:
    """The key a request for ``model`` to ``api_base`` carries, as its chat calls send
    it: ``api_key`` (``RLM.api_key``, always the configured base's) where set, else the
    environment's where it may go there. For what is asked of a local server besides
    chat (its window, slots, tokenizer, whether it is busy): provider by prefix."""
    if api_key:
        return api_key
    provider, _, name = model.partition("/")
    return environment_key(provider if name else None, api_base)


def litellm_api_key(litellm: Any, config: RLMConfig, model: str) -> str | None:
    """The ``api_key`` a litellm request for ``model`` carries: ``RLM.api_key``; a
    placeholder where litellm would read an environment key that must not go to this
    api_base (or a keyless server of the user's needs one: litellm's OpenAI client sends
    nothing without); None where litellm may read its own."""
    if config.api_key:
        return config.api_key
    return PLACEHOLDER_KEY if keyless(litellm, config, model) else None


def withheld_variable(litellm: Any, config: RLMConfig, model: str) -> str | None:
    """The environment variable set with ``model``'s key that its calls do not send (its
    service is not at the api_base in use), else None."""
    home = _withheld_home(litellm, config, model)
    if home is None:
        return None
    names = (*home.variables, *key_variables(litellm, model)) if litellm else home.variables
    return next((n for n in names if os.environ.get(n)), None)


def _withheld_home(litellm: Any, config: RLMConfig, model: str) -> PublicHome | None:
    provider = _provider(litellm, model, config.api_base)
    if config.api_key or (litellm is not None and _module_key(litellm, provider)):
        return None  # a key set for these calls, not read from the environment
    return foreign_home(provider, config.api_base or getattr(litellm, "api_base", None))


def _module_key(litellm: Any, provider: str | None) -> bool:
    """Whether litellm's module settings hold a key it sends before the environment's."""
    return any(getattr(litellm, s, None) for s in ("api_key", f"{provider}_key"))


def _provider(litellm: Any, model: str, api_base: str | None) -> str | None:
    """litellm's provider of ``model``; without litellm, the one its prefix names."""
    if litellm is not None:
        return provider_of(litellm, model, api_base)
    provider, _, name = model.partition("/")
    return provider if name and provider in _PREFIXES_WITHOUT_LITELLM else None


def _home_or_paired(home: PublicHome, api_base: str) -> bool:
    where = _normalised(api_base)
    if where[1] == home.host:
        return True
    return any(os.environ.get(n) and _normalised(os.environ[n]) == where for n in home.bases)


@functools.lru_cache(maxsize=64)
def _normalised(base: str) -> tuple[str, str | None, int | str | None, str]:
    """``base`` as compared: scheme and host in lower case, the default port spelt out,
    no trailing slash (``HTTP://Host:80/v1/`` is ``http://host/v1``)."""
    parts = urlsplit(base.strip())
    scheme = parts.scheme.lower()
    try:
        port: int | str | None = parts.port or {"http": 80, "https": 443}.get(scheme)
    except ValueError:  # not a port: compared as written
        port = parts.netloc
    return scheme, parts.hostname, port, parts.path.rstrip("/")


# -- one RLM.api_key, one provider -------------------------------------------------------

# Bare names whose family says their provider without litellm.
_BARE_FAMILIES = (
    (re.compile(r"^(?:gpt-|o\d|chatgpt-)"), "openai"),
    (re.compile(r"^claude-"), "anthropic"),
    (re.compile(r"^gemini-"), "gemini"),
)


def api_key_across_providers(litellm: Any, config: RLMConfig, model: str) -> APIKeyError | None:
    """An ``APIKeyError`` (a ``ConfigError``: one line, nothing sent) when ``RLM.api_key``
    would go to two providers: with no ``RLM.api_base`` each model's calls go to its
    provider's own API, and a key is one provider's (an Anthropic key sent to OpenAI is a
    leak, then a 401). With an api_base every model goes to that one server, whose key it
    is: no error."""
    found: dict[str, tuple[str, str]] = {}  # whose key -> (a model, its provider)
    for name in _sharing_the_key(config, model):
        provider = _key_provider(litellm, name)
        if provider is not None:
            home = PUBLIC_HOMES.get(provider)
            found.setdefault(home.owner if home else provider, (name, provider))
    if len(found) < 2:
        return None
    (first, first_provider), (second, second_provider) = list(found.values())[:2]
    return APIKeyError(
        model,
        f"RLM.api_key would be sent to two providers: {first!r} ({first_provider}) and "
        f"{second!r} ({second_provider}); leave RLM.api_key unset so each reads its own "
        "environment variable, or give each model its key in RLM.model_list",
        "RLM.api_key set for models of two providers",
    )


def key_check_needs_litellm(config: RLMConfig, model: str) -> bool:
    """Whether ``api_key_across_providers`` needs litellm loaded to tell the providers
    apart (a bare name of no known family, e.g. ``command-r``): load it before the check."""
    return any(_key_provider(None, name) is None for name in _sharing_the_key(config, model))


def _sharing_the_key(config: RLMConfig, model: str) -> tuple[str, ...]:
    """The models ``RLM.api_key`` goes to, each once, when it may be one provider's key
    sent to another's (no api_base): the root, the sub-model and ``model``; else none."""
    if not config.api_key or config.api_base:
        return ()
    return tuple(dict.fromkeys((config.model, config.effective_sub_model, model)))


def _key_provider(litellm: Any, model: str) -> str | None:
    if litellm is not None:
        return provider_of(litellm, model, None)
    provider = _provider(None, model, None)
    if provider is None and "/" not in model:
        provider = next((p for family, p in _BARE_FAMILIES if family.match(model)), None)
    return provider
