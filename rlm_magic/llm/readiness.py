"""What a call needs loaded before it leaves without litellm: the price map (whether a
price is tiered), aiohttp and the TLS context, loaded off the loop once (~0.1 s of
imports and certificates the first time), and litellm itself only for the models that
need it (``litellm_for``)."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from . import litellm_loader, price_map

if TYPE_CHECKING:
    from .endpoints import Endpoint

_wire_is_ready = False  # once: a thread's hop on every call cost more than the call


def ready(litellm: Any) -> bool:
    """Whether a call with ``litellm`` (None: not imported) needs nothing loaded first."""
    return litellm is not None or (_wire_is_ready and price_map.ready())


async def ready_without_litellm() -> None:
    """Off the loop, once: the price map, aiohttp and the TLS context."""
    if _wire_is_ready:
        await price_map.load()  # (read once: nothing to do after)
    else:
        await asyncio.gather(price_map.load(), asyncio.to_thread(_wire_ready))


def _wire_ready() -> None:
    global _wire_is_ready
    import aiohttp  # noqa: F401 - imported here, in a thread, rather than on the loop

    litellm_loader.ssl_context()
    _wire_is_ready = True


async def litellm_for(endpoint: Endpoint, *models: str) -> Any:
    """litellm, imported (off the loop) unless every one of ``models`` goes without
    it at ``endpoint`` (``Endpoint.light``): then None, and nothing imports it."""
    litellm = litellm_loader.loaded_litellm()
    if litellm is not None:
        return litellm
    await ready_without_litellm()
    if models and all(endpoint.light(model) for model in models):
        return None
    return await litellm_loader.load_litellm()
