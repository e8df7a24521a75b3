"""The offline demo model: a scripted stand-in for a real provider, so rlm-magic can be
tried with no API key and no network.

``%rlm demo`` starts an OpenAI-compatible server on 127.0.0.1 (in a thread of its own)
and points ``RLM`` at it. Requests travel the same path as to a real provider: litellm,
HTTP, JSON. It is **not a language model**:

- as *root* model it plays a fixed RLM strategy for the demo tasks: look at the context,
  split it into chunks, fan out with ``llm_query_batch`` (or ``rlm_query_batch`` over a
  dict of documents), add the answers up in code and finish with ``FINAL_VAR``;
- as *sub* model it answers counting and sentiment prompts by rule;
- it waits a realistic, deterministic time per request, so concurrency is visible.

The demo models carry pretend prices (those of a small hosted model), so cost tracking
and budgets can be seen working.

The package: ``server`` (the OpenAI-compatible chat server, also the tests' server's
base), ``batches`` (a provider's batch jobs, served beside it), ``script`` (what the
demo models answer); this module starts and stops the demo and re-exports their names.
It imports nothing of rlm-magic but the llm layer (litellm, to register the prices).
"""

from __future__ import annotations

import threading
from typing import Any, Protocol

from .batches import BatchJobsAPI
from .script import DemoServer, root_reply, sub_reply, typed_reply, typed_schema
from .server import HTTPError, LocalChatServer, completion_json, split_tokens, usage_json

ROOT_MODEL = "rlm-demo-root"
SUB_MODEL = "rlm-demo-sub"
# Pretend prices, USD per token (a small hosted model's), to show cost accounting.
PRETEND_PRICES = {"input_cost_per_token": 0.15e-6, "output_cost_per_token": 0.60e-6}

# The demo's public names, wherever they live: tests, benchmarks and notebooks import
# them from here.
__all__ = [
    "PRETEND_PRICES",
    "ROOT_MODEL",
    "SUB_MODEL",
    "BatchJobsAPI",
    "DemoServer",
    "HTTPError",
    "LocalChatServer",
    "completion_json",
    "register_pretend_prices",
    "root_reply",
    "split_tokens",
    "start",
    "stop",
    "sub_reply",
    "typed_reply",
    "typed_schema",
    "usage_json",
    "wait_until_priced",
]


# -- starting it from a notebook -------------------------------------------------------


class Settings(Protocol):
    """The settings the demo points at itself: an ``RLM``'s (a layer above this one)."""

    model: str
    sub_model: str
    api_base: str | None
    api_key: str | None


_server: DemoServer | None = None
_saved_settings: dict[str, Any] | None = None
_DEMO_SETTINGS = ("model", "sub_model", "api_base", "api_key")


def register_pretend_prices() -> None:
    """Tell litellm the demo models' pretend prices, so their cost shows."""
    from ..llm.litellm_loader import import_litellm

    litellm = import_litellm()
    litellm.register_model(
        {
            name: {
                **PRETEND_PRICES,
                "cache_read_input_token_cost": 0.0,
                "cache_creation_input_token_cost": 0.0,
                # Batch jobs at half price, as the big providers do.
                "input_cost_per_token_batches": PRETEND_PRICES["input_cost_per_token"] / 2,
                "output_cost_per_token_batches": PRETEND_PRICES["output_cost_per_token"] / 2,
                "supports_response_schema": True,
                "litellm_provider": "openai",
                "mode": "chat",
                "max_tokens": 4096,
                "max_input_tokens": 128000,
            }
            for name in (ROOT_MODEL, SUB_MODEL, f"openai/{ROOT_MODEL}", f"openai/{SUB_MODEL}")
        }
    )


def start(rlm: Settings | None = None, **latency: float) -> DemoServer:
    """Start the demo server (once) and point ``rlm``'s settings at it."""
    global _server, _saved_settings
    if _server is None or not _server.running:
        _server = DemoServer(**latency).start()
    if rlm is not None:
        if _saved_settings is None:
            _saved_settings = {name: getattr(rlm, name) for name in _DEMO_SETTINGS}
        rlm.model, rlm.sub_model = f"openai/{ROOT_MODEL}", f"openai/{SUB_MODEL}"
        rlm.api_base, rlm.api_key = _server.base_url, "demo-no-key-needed"
    if not _server.prices_registered.is_set():
        # Registering the prices imports litellm (seconds, the first time): do it in the
        # background, so `%rlm demo` returns at once.
        threading.Thread(
            target=_register_prices, args=(_server,), daemon=True, name="rlm-demo-prices"
        ).start()
    return _server


def _register_prices(server: DemoServer) -> None:
    try:
        register_pretend_prices()
    finally:  # even if it failed: answer unpriced rather than never
        server.prices_registered.set()


def wait_until_priced(timeout: float = 60.0) -> None:
    """Block until the running demo's pretend prices are registered (if it runs): what
    prices a plan made before the first call (an evaluation's dry run)."""
    if _server is not None:
        _server.prices_registered.wait(timeout)


def stop(rlm: Settings | None = None) -> None:
    """Stop the demo server and restore the settings it replaced."""
    global _server, _saved_settings
    if _server is not None:
        _server.stop()
        _server = None
    if rlm is not None and _saved_settings is not None:
        for name, value in _saved_settings.items():
            setattr(rlm, name, value)
        _saved_settings = None
