"""Settings of rlm-magic: one traitlets configurable, so ``%config RLM.model = ...`` and
``c.RLM.model = ...`` in ``ipython_config.py`` both work.

``RLMConfig`` holds the traits; the runner class ``rlm_magic.RLM`` subclasses it, so the
configurable users address is named ``RLM``.

Why one module: it is one concept, the settings, each trait with its help, its check and
its one-line error; it is long because there are forty of them, and their help is what
``%config RLM`` shows, read in one place.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from traitlets import Bool, Dict, Float, Int, List, TraitError, Unicode, default, validate
from traitlets.config import Configurable

from ._secrets import Secret, hidden, mask_secret, masked, secrets_in

# Keys of litellm_kwargs that rlm-magic sets itself; passing them would silently fight it.
_OWNED_KWARGS = {
    "model",
    "messages",
    "stream",
    "stream_options",
    "api_key",
    "api_base",
    "base_url",
    "timeout",
    "max_retries",
    "num_retries",
    "max_tokens",
    "caching",
}


# RLM.sandbox's values: the backends' names (repl.backends, which a test holds equal).
SANDBOX_KINDS = ("auto", "process", "wasm", "container", "none")


def default_cache_dir() -> str:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(Path.home(), ".cache")
    return os.path.join(base, "rlm-magic")


# What traitlets hands a validator: the trait, its owner and the proposed value.
Proposal = Mapping[str, Any]


def _at_least(minimum: int) -> Callable[[RLMConfig, Proposal], Any]:
    def check(self: RLMConfig, proposal: Proposal) -> Any:
        value = proposal["value"]
        if value < minimum:
            raise TraitError(f"RLM.{proposal['trait'].name} must be >= {minimum}, got {value!r}")
        return value

    return check


def _none_or(
    accepted: Callable[[Any], bool], requirement: str
) -> Callable[[RLMConfig, Proposal], Any]:
    """A check: None, or a value ``accepted`` takes; else a one-line error that says
    ``requirement`` (a NaN is never accepted: it compares false)."""

    def check(self: RLMConfig, proposal: Proposal) -> Any:
        value = proposal["value"]
        if value is not None and not accepted(value):
            raise TraitError(f"RLM.{proposal['trait'].name} must be {requirement}, got {value!r}")
        return value

    return check


def _positive(self: RLMConfig, proposal: Proposal) -> Any:
    value = proposal["value"]
    if not value > 0:
        raise TraitError(f"RLM.{proposal['trait'].name} must be > 0, got {value!r}")
    return value


class RLMConfig(Configurable):
    """Settings shared by the notebook helpers and ``%%rlm`` runs."""

    # -- models and provider ------------------------------------------------------------
    model = Unicode(
        help="Root model: any litellm model string, e.g. 'gpt-4o-mini', "
        "'anthropic/claude-sonnet-4-5', 'ollama/llama3'. "
        "Default: $RLM_MODEL, else 'gpt-4o-mini'."
    ).tag(config=True)
    sub_model = Unicode(
        help="Model for llm_query sub-calls. Default: $RLM_SUB_MODEL, else the root model."
    ).tag(config=True)
    api_base = Unicode(
        None,
        allow_none=True,
        help="Provider base URL, e.g. 'http://localhost:11434'. "
        "Default: litellm's usual environment variables.",
    ).tag(config=True)
    api_key = Unicode(
        None,
        allow_none=True,
        help="API key, sent with every model's calls: one provider's, or the key of "
        "the server at api_base (two providers' models with one key are refused). "
        "Default: each provider's own environment variable (OPENAI_API_KEY, "
        "ANTHROPIC_API_KEY, ...), sent only to that provider or the base its "
        "environment names.",
    ).tag(config=True)
    litellm_kwargs = Dict(
        help="Extra keyword arguments for litellm.acompletion, e.g. {'temperature': 0}."
    ).tag(config=True)
    model_list: List[dict[str, Any]] = List(
        help="A LiteLLM Router model list: [{'model_name': 'sub', "
        "'litellm_params': {'model': ..., 'api_key': ...}}, ...]. When "
        "set, calls go through the Router and model / sub_model name its "
        "groups."
    ).tag(config=True)
    router_settings = Dict(
        help="Keyword arguments for the Router, e.g. "
        "{'routing_strategy': 'simple-shuffle', 'fallbacks': [...]}."
    ).tag(config=True)

    # -- calls --------------------------------------------------------------------------
    max_concurrency = Int(16, help="Most model requests in flight at once.").tag(config=True)
    timeout = Float(
        120.0,
        help="Seconds per model call attempt; for a streamed call, seconds without a new token.",
    ).tag(config=True)
    max_retries = Int(
        2,
        help="Retries on 408/409, 5xx, timeouts and connection errors, "
        "with exponential backoff and jitter (429s are waited "
        "out instead, within rate_limit_wait).",
    ).tag(config=True)
    retry_backoff = Float(
        0.5, help="Seconds before the first retry; doubles each retry, with full jitter."
    ).tag(config=True)
    max_tokens = Int(4096, help="Most output tokens per sub-call.").tag(config=True)
    rate_limit_wait = Float(
        600.0,
        help="Seconds one call may spend waiting out the "
        "provider's rate limits (429s) before it "
        "fails; these waits use no retries.",
    ).tag(config=True)
    rpm = Float(
        None,
        allow_none=True,
        help="Requests per minute the provider allows, if you know your tier: "
        "paced from the first request. Default: learned from the provider's "
        "rate-limit headers and 429s.",
    ).tag(config=True)
    tpm = Float(
        None, allow_none=True, help="Input tokens per minute the provider allows (as rpm)."
    ).tag(config=True)
    progress = Bool(True, help="Show progress bars and status panels.").tag(config=True)
    wire_transport = Bool(
        True,
        help="Send requests to OpenAI-compatible endpoints "
        "(openai/, hosted_vllm/, litellm_proxy/, a local "
        "server's /v1) straight over HTTP, at a fifteenth "
        "of litellm's CPU per call; False: every call goes "
        "through litellm.",
    ).tag(config=True)
    cache = Bool(
        False, help="Answer identical requests from an on-disk cache that survives kernel restarts."
    ).tag(config=True)
    cache_dir = Unicode(
        help="Where the cache lives. Default: ~/.cache/rlm-magic (or $XDG_CACHE_HOME/rlm-magic)."
    ).tag(config=True)

    # -- streaming and prompt caching (issue 12) ----------------------------------------
    stream = Bool(
        True,
        help="Stream every call (root turns, sub-calls, batch items): the "
        "status panel shows the text as it arrives, and `timeout` "
        "then limits a stall (no new tokens), not the whole answer. "
        "Turned off by itself for a provider that cannot stream.",
    ).tag(config=True)
    early_execution = Bool(
        True,
        help="Start a ```repl block as soon as its closing "
        "fence has streamed in, while the model still "
        "writes (streamed turns only). Blocks still run "
        "in order, and the model sees the same.",
    ).tag(config=True)
    prompt_caching = Bool(
        True,
        help="Mark the root conversation's stable prefix for "
        "providers whose prompt cache needs explicit "
        "cache_control markers (Anthropic).",
    ).tag(config=True)

    # -- the RLM loop ---------------------------------------------------------------------
    max_iterations = Int(30, help="Most root-model turns per run.").tag(config=True)
    max_depth = Int(
        1, help="How deep rlm_query may nest child RLMs; 0 makes rlm_query a plain llm_query."
    ).tag(config=True)
    max_sub_calls = Int(
        500, help="Most sub-calls per run; past it they return an error string and send nothing."
    ).tag(config=True)
    max_cost_usd = Float(
        None,
        allow_none=True,
        help="Dollars one run (its child runs included) may spend: a call is sent only "
        "if the most it can cost (its input, and max_tokens of answer) fits in what is "
        "left. Default: no limit.",
    ).tag(config=True)
    max_session_cost_usd = Float(
        None,
        allow_none=True,
        help="Dollars this kernel may spend, through every RLM: runs, notebook helpers "
        "and maps (held as max_cost_usd is), checked against this RLM's setting at each "
        "call; counted from the kernel's first call, across %reload_ext. An RLM given a "
        "ledger of its own counts its own. Default: no limit.",
    ).tag(config=True)
    step_timeout = Float(
        300.0,
        help="Seconds one REPL step may run before it is "
        "stopped; its sub-calls end in time (their timeouts "
        "and retries shrink to fit).",
    ).tag(config=True)
    context_window = Int(
        None,
        allow_none=True,
        help="Input tokens of a model litellm has no entry for (a local "
        "server, a Router group); it wins over every other source. "
        "Default: what a local server reports (llama.cpp, vLLM, "
        "Ollama), else litellm's model info, else what the provider's "
        "context-length error says.",
    ).tag(config=True)
    compact_at = Float(
        0.85,
        help="Compact the root model's conversation (it summarises "
        "its progress; the full history stays in the REPL "
        "variable `history`) before a turn would pass this "
        "share of its window.",
    ).tag(config=True)
    max_output_chars = Int(
        20_000,
        help="Most characters of REPL output shown to the model per step. Left "
        "at its default, it is cut to a quarter of the root model's window "
        "(at the characters per token counted for it) once that is known.",
    ).tag(config=True)
    system_prompt = Unicode(
        None,
        allow_none=True,
        help="Replace the built-in RLM system prompt. It is "
        "formatted with {context_type}, {context_length}, "
        "{context_preview}, {sub_model_reads} (how much one sub-call "
        "reads), {chunk_size} (the chunk advice), {max_depth}, "
        "{depth_left}, {max_output_chars}.",
    ).tag(config=True)

    # -- where the model's code runs ------------------------------------------------------
    sandbox = Unicode(
        "auto",
        help="Where the model's code runs: 'process' (a sandbox process confined by "
        "Linux's layers), 'wasm' (CPython in WebAssembly, in a confined Deno: any OS; "
        "pip install 'rlm-magic[wasm]'), 'container' (the sandbox process in a Docker or "
        "Podman container: RLM_CONTAINER_RUNTIME, RLM_CONTAINER_IMAGE; build the image "
        "as the error says), 'none' (threads of this kernel), or 'auto' "
        "(the strongest that works here: 'process' on Linux with user namespaces, "
        "else 'wasm' when Deno is installed).",
    ).tag(config=True)
    sandbox_memory_mb = Int(
        4096,
        help="Memory limit of a sandbox, in MB: address space per process ('process'), "
        "WebAssembly memory ('wasm'), the container's ('container').",
    ).tag(config=True)
    sandbox_disk_mb = Int(
        512,
        help="Size of the sandbox's working folder (a tmpfs: it "
        "holds RAM while files are in it), in MB.",
    ).tag(config=True)
    sandbox_max_processes = Int(128, help="Most processes and threads in the sandbox at once.").tag(
        config=True
    )
    sandbox_max_children = Int(
        4,
        help="Most child RLMs (rlm_query) of one depth running in sandboxes at once, "
        "across the whole run; the rest wait for one to end. Together they hold at most "
        "sandbox_max_processes processes and sandbox_disk_mb of disk, shared evenly.",
    ).tag(config=True)
    sandbox_env = List(
        Unicode(),
        help="Names of environment variables the sandbox may "
        "see besides locale and time zone (values holding "
        "a configured secret are still left out).",
    ).tag(config=True)
    sandbox_require_isolation = Bool(
        False,
        help="Refuse to start a sandbox unless every isolation layer its backend "
        "requires holds (result.isolation lists them: for 'process' user, pid, "
        "filesystem, network, syscalls, processes).",
    ).tag(config=True)

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        # Moves on every change of a setting: what is built from the settings (a
        # model's call plan, ``llm.endpoints``) is kept until it moves, instead of
        # being built again from ~30 reads of them on every call.
        self.revision = 0
        self.observe(self._setting_changed)

    def _setting_changed(self, change: Any) -> None:
        self.revision += 1

    @default("model")
    def _default_model(self) -> str:
        return os.environ.get("RLM_MODEL") or "gpt-4o-mini"

    @default("sub_model")
    def _default_sub_model(self) -> str:
        return os.environ.get("RLM_SUB_MODEL", "")

    @default("cache_dir")
    def _default_cache_dir(self) -> str:
        return default_cache_dir()

    @validate("model")
    def _check_model(self, proposal: Proposal) -> str:
        value: str = proposal["value"].strip()
        if not value:
            raise TraitError(
                "RLM.model must be a non-empty litellm model string, e.g. 'gpt-4o-mini'"
            )
        return value

    @validate("sub_model")
    def _check_sub_model(self, proposal: Proposal) -> str:
        value: str = proposal["value"]
        return value.strip()

    @validate("api_base")
    def _check_api_base(self, proposal: Proposal) -> str | None:
        value: str | None = proposal["value"]
        if value is None or value == "":
            return None
        parsed = urlparse(value)
        if parsed.scheme not in ("http", "https") or not parsed.netloc:
            raise TraitError(f"RLM.api_base must be an http(s) URL, got {value!r}")
        return value.rstrip("/")

    @validate("api_key")
    def _check_api_key(self, proposal: Proposal) -> str | None:
        value: str | None = proposal["value"]
        return Secret(value) if value else None  # shown masked, used as it is

    @validate("litellm_kwargs")
    def _check_litellm_kwargs(self, proposal: Proposal) -> dict[str, Any]:
        value: dict[str, Any] = proposal["value"]
        clash = sorted(set(value) & _OWNED_KWARGS)
        if clash:
            raise TraitError(
                f"RLM.litellm_kwargs may not set {', '.join(clash)}: "
                "use the RLM setting of that name instead"
            )
        result: dict[str, Any] = hidden(value)  # a header's key is shown masked
        return result

    _check_concurrency = validate("max_concurrency")(_at_least(1))
    _check_timeout = validate("timeout", "step_timeout", "rate_limit_wait")(_positive)
    _check_retries = validate("max_retries", "max_depth", "max_sub_calls")(_at_least(0))
    _check_backoff = validate("retry_backoff")(_at_least(0))
    _check_counts = validate("max_tokens", "max_iterations", "max_output_chars")(_at_least(1))
    _check_sandbox_memory = validate("sandbox_memory_mb")(_at_least(256))
    _check_sandbox_disk = validate("sandbox_disk_mb")(_at_least(1))
    _check_sandbox_processes = validate("sandbox_max_processes")(_at_least(8))
    _check_sandbox_children = validate("sandbox_max_children")(_at_least(1))

    @validate("sandbox")
    def _check_sandbox(self, proposal: Proposal) -> str:
        value: str = proposal["value"].strip().lower()
        if value not in SANDBOX_KINDS:
            raise TraitError(
                f"RLM.sandbox must be one of {', '.join(SANDBOX_KINDS)}, got {proposal['value']!r}"
            )
        return value

    @validate("model_list")
    def _check_model_list(self, proposal: Proposal) -> list[dict[str, Any]]:
        try:
            return [hidden(entry) for entry in check_model_list(proposal["value"])]
        except ValueError as exc:
            raise TraitError(str(exc)) from None

    @validate("router_settings")
    def _check_router_settings(self, proposal: Proposal) -> dict[str, Any]:
        value: dict[str, Any] = proposal["value"]
        clash = sorted(set(value) & {"model_list"})
        if clash:
            raise TraitError("RLM.router_settings may not set model_list: use RLM.model_list")
        result: dict[str, Any] = hidden(value)  # e.g. a Redis password
        return result

    _check_rate = validate("rpm", "tpm")(_none_or(lambda v: v > 0, "> 0 or None (learned)"))
    _check_cost = validate("max_cost_usd", "max_session_cost_usd")(
        _none_or(lambda v: v >= 0, ">= 0 or None")
    )
    _check_window = validate("context_window")(
        _none_or(lambda v: v >= 256, ">= 256 tokens or None")
    )
    _check_compact_at = validate("compact_at")(
        _none_or(lambda v: 0.1 <= v <= 1.0, "between 0.1 and 1.0")
    )

    # -- derived --------------------------------------------------------------------------
    @property
    def effective_sub_model(self) -> str:
        return self.sub_model or self.model

    def configured_secrets(self) -> list[str]:
        """Every secret the settings hold: the api_key, and secret-looking values inside
        litellm_kwargs, model_list and router_settings (headers included), with litellm's
        ``os.environ/NAME`` references resolved. Redaction and the sandbox's environment
        both keep these from the model."""
        return secrets_in(
            {
                "api_key": self.api_key,
                "litellm_kwargs": self.litellm_kwargs,
                "model_list": self.model_list,
                "router_settings": self.router_settings,
            }
        )

    def settings(self, *, mask_secrets: bool = True) -> dict[str, Any]:
        """The effective value of every setting, with secrets masked."""
        values = {name: getattr(self, name) for name in sorted(self.class_trait_names(config=True))}
        values["sub_model"] = self.effective_sub_model
        if mask_secrets:
            values["api_key"] = mask_secret(values["api_key"])
            values["litellm_kwargs"] = masked(values["litellm_kwargs"])
            values["router_settings"] = masked(values["router_settings"])
            values["model_list"] = [
                {**entry, "litellm_params": masked(entry["litellm_params"])}
                for entry in values["model_list"]
            ]
        return values

    @classmethod
    def class_get_trait_help(cls, trait: Any, inst: Any = None, helptext: str | None = None) -> str:
        """What ``%config RLM`` prints for a trait: traitlets' text, whose ``Current:``
        line (the value's repr) shows secrets masked. (A secret setting's value is a
        ``Secret``, masked in any repr; a value changed in place may hold plain strings,
        so the line is built from the masked settings, whatever it holds.)"""
        text: str = super().class_get_trait_help(trait, inst, helptext)
        name = trait.name
        if inst is None or name not in _SECRET_SETTINGS:
            return text
        lines = text.split("\n")
        for index, line in enumerate(lines):
            if line.lstrip().startswith("Current: "):
                indent = line[: len(line) - len(line.lstrip())]
                shown = inst.settings(mask_secrets=True)[name]
                lines[index] = f"{indent}Current: {shown!r}"
        return "\n".join(lines)


# The settings that may hold a secret, masked by %rlm config and %config RLM.
_SECRET_SETTINGS = frozenset({"api_key", "litellm_kwargs", "model_list", "router_settings"})


def check_model_list(value: Any) -> list[dict[str, Any]]:
    """``value`` if it is a Router model list; otherwise a one-line ``ValueError``."""
    if not isinstance(value, list):
        raise ValueError(
            f"RLM.model_list must be a list of deployments, got {type(value).__name__}"
        )
    for index, entry in enumerate(value):
        where = f"RLM.model_list[{index}]"
        if not isinstance(entry, dict) or not isinstance(entry.get("model_name"), str):
            raise ValueError(
                f"{where} needs a 'model_name' (the group it serves), as in "
                "{'model_name': 'sub', 'litellm_params': {'model': ...}}"
            )
        params = entry.get("litellm_params")
        if not isinstance(params, dict) or not isinstance(params.get("model"), str):
            raise ValueError(
                f"{where} needs 'litellm_params' with a 'model', e.g. "
                "{'model': 'openai/gpt-4o-mini', 'api_key': ...}"
            )
    return value
