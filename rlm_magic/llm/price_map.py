"""litellm's price map without importing litellm.

Importing litellm takes seconds and ~170 MB; an OpenAI-compatible endpoint needs none of
it but the prices. litellm ships its price map as a JSON file in its package
(``model_prices_and_context_window_backup.json``), the very map it loads itself when
``LITELLM_LOCAL_MODEL_COST_MAP`` is set (as rlm-magic sets it): read once, here, the
package found without importing it. Once litellm is imported (by rlm-magic or by the
user), its own ``model_cost`` is the map: models registered with
``litellm.register_model`` count.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import threading
from typing import Any

from .litellm_loader import imported_litellm

_FILE = "model_prices_and_context_window_backup.json"
_bundled: dict[str, Any] | None = None
_lock = threading.Lock()


def _litellm_if_imported() -> Any:
    """litellm when it is imported (fully: ``model_cost`` set), else None."""
    module = imported_litellm()
    return module if getattr(module, "model_cost", None) is not None else None


def bundled_path() -> str | None:
    """Where litellm's bundled price map is, found without importing litellm."""
    try:
        spec = importlib.util.find_spec("litellm")
    except (ImportError, ValueError):
        return None
    for directory in (spec.submodule_search_locations or []) if spec else []:
        path = os.path.join(directory, _FILE)
        if os.path.exists(path):
            return path
    return None


def bundled() -> dict[str, Any]:
    """litellm's bundled price map, read on first use (~40 ms: see ``load``)."""
    global _bundled
    if _bundled is None:
        with _lock:
            if _bundled is None:
                path = bundled_path()
                prices: dict[str, Any] = {}
                if path is not None:
                    try:
                        with open(path, encoding="utf-8") as file:
                            prices = json.load(file)
                    except (OSError, ValueError):
                        prices = {}
                prices.pop("fallback_generalizations", None)  # (litellm keeps it apart)
                _resolve_aliases(prices)
                _bundled = prices
    return _bundled


def _resolve_aliases(prices: dict[str, Any]) -> None:
    """An entry that is ``alias_of`` another takes that one's fields, as litellm does."""
    for name, found in list(prices.items()):
        if isinstance(found, dict) and "alias_of" in found:
            target = prices.get(found["alias_of"])
            if isinstance(target, dict):
                merged = dict(target)
                merged.update((k, v) for k, v in found.items() if k != "alias_of")
                prices[name] = merged


def ready() -> bool:
    """Whether prices can be read without waiting (``load`` has nothing to do)."""
    return _bundled is not None or _litellm_if_imported() is not None


async def load() -> None:
    """Read the bundled map off the loop, unless litellm's own map is there."""
    if _bundled is None and _litellm_if_imported() is None:
        await asyncio.to_thread(bundled)


def model_cost() -> dict[str, Any]:
    """The price map in force: litellm's ``model_cost`` once litellm is imported, else
    the bundled file's (the same entries: litellm loads that file)."""
    litellm = _litellm_if_imported()
    if litellm is not None:
        prices: dict[str, Any] = litellm.model_cost
        return prices
    return bundled()


def entry(names: tuple[str, ...] | list[str]) -> dict[str, Any] | None:
    """The first of ``names`` the map lists."""
    prices = model_cost()
    for name in names:
        found = prices.get(name)
        if found is not None:
            return found if isinstance(found, dict) else None
    return None


def names_of(model: str) -> tuple[str, ...]:
    """Where the map may list ``model``: as given, then without its provider prefix."""
    return (model, model.split("/", 1)[1]) if "/" in model else (model,)
