"""Where a call learns its model's window before it is sent: litellm (off the loop: for
some providers that is an HTTP request), litellm's bundled price map for models that go
without it, and a local server's own answer (its window, its tokenizer). What is
learned is kept in ``windows`` and ``local_servers``; this module only asks."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from . import litellm_loader, local_servers, windows

if TYPE_CHECKING:
    from ..config import RLMConfig
    from .endpoints import Endpoint


async def look_up(
    config: RLMConfig,
    endpoint: Endpoint,
    models: tuple[str, ...],
    litellm: Any,
    sample: str | None = None,
) -> None:
    """Learn these models' windows once each (see ``LLMClient.look_up_windows``)."""
    names = set(models)
    for model in models:
        names.update(endpoint.models_behind(model))
    missing = windows.missing_model_info(sorted(names))
    if litellm is None:
        windows.look_up_in_price_map(missing)
        missing = []
    # A local server says what window it runs each model with (once per server).
    unasked = (
        [m for m in models if not local_servers.asked(config.api_base, m)]
        if endpoint.probes_local_servers
        else []
    )
    if missing or unasked:
        await asyncio.gather(
            *([asyncio.to_thread(windows.look_up, litellm, missing)] if missing else []),
            *(local_servers.ask(config.api_base, m, config.api_key) for m in unasked),
        )
    if sample and config.api_base and endpoint.probes_local_servers:
        await windows.learn_tokenizers(config.api_base, set(models), sample, config.api_key)


def settled(config: RLMConfig, endpoint: Endpoint, model: str) -> bool:
    """Whether looking ``model``'s windows up again would learn nothing: litellm (or
    its price map) was asked, and a local server, if any, answered (a guessed
    window is asked again after a while)."""
    if windows.missing_model_info([model, *endpoint.models_behind(model)]):
        return False
    return not endpoint.probes_local_servers or local_servers.settled(config.api_base, model)


def server_count(config: RLMConfig, endpoint: Endpoint, model: str) -> windows.ServerCount | None:
    """The server's own count of a text's tokens, where it has one (a local
    llama.cpp's or vLLM's ``/tokenize``): it reads as the model does."""
    api_base = config.api_base
    if not (
        api_base and endpoint.probes_local_servers and local_servers.tokenizes(api_base, model)
    ):
        return None
    return lambda text: local_servers.count_tokens(api_base, model, text, config.api_key)


def input_window(config: RLMConfig, endpoint: Endpoint, model: str, advice: bool) -> int | None:
    """Input tokens ``model`` takes, if known (see ``windows.input_window``)."""
    return windows.input_window(
        litellm_loader.loaded_litellm(),
        model,
        endpoint.identity,
        config.context_window,
        endpoint.models_behind(model),
        advice,
    )
