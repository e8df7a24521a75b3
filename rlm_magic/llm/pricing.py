"""What a call cost, in dollars, at litellm's prices (or a LiteLLM Proxy's word).

Every price comes from litellm's price map; a model it does not price costs ``None``
(unknown), never a false $0. The wire transport prices its answers here with a few
dictionary lookups (litellm's cost machinery costs ~0.15 ms of CPU a call); answers that
came through litellm carry litellm's own price. A LiteLLM Proxy prices a call with its
upstream's price and says so in a header, which counts when litellm knows no price.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from functools import lru_cache
from typing import Any

from . import price_map
from .litellm_loader import imported_litellm
from .ratelimit import non_negative

# Where a LiteLLM Proxy puts its price of a call: in the response's headers (the wire
# transport reads them), and as litellm passes those headers on (``_hidden_params``).
PROXY_COST_HEADER = "x-litellm-response-cost"
LITELLM_PROXY_COST_HEADER = "llm_provider-" + PROXY_COST_HEADER


def cost_of_response(response: Any, litellm: Any) -> float | None:
    """Dollars for a response litellm made, or None when litellm does not know the price."""
    hidden = getattr(response, "_hidden_params", None) or {}
    if "response_cost" in hidden:
        # litellm already priced it (None: it knows no price); asking again costs
        # ~1 ms of CPU per call for the same answer.
        cost = hidden["response_cost"]
    else:
        try:
            cost = litellm.completion_cost(completion_response=response)
        except Exception:  # noqa: BLE001 - litellm raises for models without a price
            cost = None
    if cost is None:
        # A LiteLLM Proxy prices the call with its upstream's price and says so, even
        # when the name it answers under means nothing to litellm's price map here.
        cost = non_negative((hidden.get("additional_headers") or {}).get(LITELLM_PROXY_COST_HEADER))
    return float(cost) if cost is not None else None


def price_entry(litellm: Any, names: Sequence[str]) -> dict[str, Any] | None:
    """The first of ``names`` that litellm's price map prices, looked up at each answer
    (prices registered meanwhile count). ``litellm`` None: the map in force without
    importing it (``price_map``: the bundled file's until litellm is imported)."""
    priced = _priced(litellm, names)
    return None if priced is None else priced[1]


def _priced(litellm: Any, names: Sequence[str]) -> tuple[str, dict[str, Any]] | None:
    """The first of ``names`` the price map lists, and its entry, if it has a price."""
    prices = litellm.model_cost if litellm is not None else price_map.model_cost()
    for name in names:
        entry = prices.get(name)
        if entry is not None:
            if isinstance(entry.get("input_cost_per_token"), (int, float)):
                return name, entry
            return None
    return None


def cost_of_usage(
    litellm: Any,
    names: Sequence[str],
    input_tokens: int,
    output_tokens: int,
    cache_read: int,
    cache_written: int,
    headers: Mapping[str, Any] | None,
) -> float | None:
    """Dollars for this usage of a model priced under one of ``names``; else the
    proxy's price in ``headers``; else None."""
    priced = _priced(litellm, names)
    entry = None if priced is None else priced[1]
    if entry is not None and not _tiered(entry):
        base: float = entry["input_cost_per_token"]
        output: float = entry.get("output_cost_per_token") or 0.0
        read_price: float | None = entry.get("cache_read_input_token_cost")
        write_price: float | None = entry.get("cache_creation_input_token_cost")
        return (
            (input_tokens - cache_read - cache_written) * base
            + cache_read * (base if read_price is None else read_price)
            + cache_written * (base if write_price is None else write_price)
            + output_tokens * output
        )
    if priced is not None:  # priced by the prompt's size: litellm knows the tiers
        # (a call sent without litellm meets such an entry only once litellm is
        # imported: one registered since, with tiers, e.g. ``register_model``'s)
        litellm = litellm if litellm is not None else imported_litellm()
        try:
            prompt: float
            completion: float
            prompt, completion = litellm.cost_per_token(
                # The name the map prices it under: litellm knows no price for
                # "openai/gemini-2.5-pro" (Gemini at an OpenAI-compatible endpoint).
                model=priced[0],
                prompt_tokens=input_tokens,
                completion_tokens=output_tokens,
                cache_read_input_tokens=cache_read,
            )
            return prompt + completion
        except Exception:  # noqa: BLE001 - a priced model is never recorded as unpriced:
            # at its highest tier's rates (what a budget held for it), not $0
            _, highest_in, highest_out = _rates(priced[1])
            return input_tokens * highest_in + output_tokens * highest_out
    cost = non_negative(headers.get(PROXY_COST_HEADER)) if headers else None
    return float(cost) if cost is not None else None


_TIERED: dict[int, tuple[dict[str, Any], bool]] = {}


def tiered_price(names: Sequence[str]) -> bool:
    """Whether the entry pricing one of ``names`` depends on the prompt's size (then
    litellm prices a call: its tiers)."""
    entry = price_entry(None, names)
    return entry is not None and _tiered(entry)


def _tiered(entry: dict[str, Any]) -> bool:
    """Whether a price depends on the prompt's size (``..._above_128k_tokens``)."""
    known = _TIERED.get(id(entry))
    if known is None or known[0] is not entry:
        known = _TIERED[id(entry)] = (entry, any("above_" in key for key in entry))
    return known[1]


def cache_saving(litellm: Any, model: str, read: int, written: int) -> float | None:
    """Dollars the provider's prompt cache saved on a call against sending the same tokens
    uncached: reads cost less than input, writes (Anthropic) cost more, so it is negative
    when writing cost more than reading saved. None when litellm has no price."""
    if not (read or written):
        return 0.0
    prices = _cache_prices(litellm, model)
    if prices is None:
        return None
    base, read_price, write_price = prices
    return read * (base - read_price) - written * (write_price - base)


@lru_cache(maxsize=64)
def _cache_prices(litellm: Any, model: str) -> tuple[float, float, float] | None:
    if litellm is None:  # not imported: the price map's entry (what litellm would read)
        info: Any = price_map.entry(price_map.names_of(model)) or {}
    else:
        try:
            info = litellm.get_model_info(model)
        except Exception:  # noqa: BLE001 - litellm raises for models it does not price
            return None
    base = info.get("input_cost_per_token")
    if base is None:
        return None
    read = info.get("cache_read_input_token_cost")
    write = info.get("cache_creation_input_token_cost")
    return (
        float(base),
        float(base if read is None else read),
        float(base if write is None else write),
    )


def batch_rates(litellm: Any, name: str, provider: str) -> tuple[float, float] | None:
    """Dollars per input and per output token at the provider's batch price (litellm's
    ``*_cost_per_token_batches``, or half the usual price where it knows no batch price);
    None when litellm knows no price for the model."""
    try:
        litellm.get_model_info(model=name, custom_llm_provider=provider)
    except Exception:  # noqa: BLE001 - unknown model: unpriced
        return None
    from litellm.cost_calculator import batch_cost_calculator
    from litellm.types.utils import Usage

    per_million = 1_000_000
    input_cost, _ = batch_cost_calculator(
        Usage(prompt_tokens=per_million, completion_tokens=0, total_tokens=per_million),
        name,
        provider,
    )
    _, output_cost = batch_cost_calculator(
        Usage(prompt_tokens=0, completion_tokens=per_million, total_tokens=per_million),
        name,
        provider,
    )
    return input_cost / per_million, output_cost / per_million


def highest_rates(litellm: Any, model: str) -> tuple[float, float] | None:
    """Dollars per input and per output token a call to ``model`` may be charged at
    most (a budget's reckoning): the highest of its entry's rates, the tiers above a
    prompt size and cache writes included (not the priority tier, which is asked for).
    None when litellm has no price for it."""
    names = (model, model.split("/", 1)[1]) if "/" in model else (model,)
    entry = price_entry(litellm, names)
    if entry is None:
        return None
    _, highest_in, highest_out = _rates(entry)
    return highest_in, highest_out


def _rates(entry: dict[str, Any]) -> tuple[dict[str, Any], float, float]:
    """``entry`` with its highest input and output rates (kept per entry)."""
    rates = _RATES.get(id(entry))
    if rates is None or rates[0] is not entry:
        rates = _RATES[id(entry)] = (entry, _highest(entry, _INPUT), _highest(entry, _OUTPUT))
    return rates


_INPUT = ("input_cost_per_token", "cache_creation_input_token_cost")
_OUTPUT = ("output_cost_per_token", "output_cost_per_reasoning_token")
_RATES: dict[int, tuple[dict[str, Any], float, float]] = {}


def _highest(entry: dict[str, Any], bases: tuple[str, ...]) -> float:
    return max(
        (
            float(value)
            for key, value in entry.items()
            if isinstance(value, (int, float))
            and any(key == base or _a_tier_of(key, base) for base in bases)
        ),
        default=0.0,
    )


def _a_tier_of(key: str, base: str) -> bool:
    """``base``'s rate above a prompt size (``..._above_200k_tokens``), not a service
    tier's rate above it (``..._above_200k_tokens_priority``: asked for, not met)."""
    return key.startswith(base + "_above_") and key.endswith("_tokens")


# What a model answering text may be priced for, in litellm's price map.
_TEXT_MODES = frozenset({"chat", "responses", "completion"})
_CEILING: tuple[tuple[int, int], tuple[float, float]] | None = None


def ceiling_rates(litellm: Any) -> tuple[float, float]:
    """Dollars per input and per output token that no model litellm's price map prices
    for text charges more than: the highest of any entry's rates (cache writes and
    reasoning included; $150 and $600 a million, o1-pro's, in litellm 1.110's map, whose
    tiers above a prompt size are all below them: not read, which took 8x as long, on a
    first call's path). The most a model priced nowhere may cost, as far as anything here
    can know; read once per map. ``litellm`` None: the map in force without importing it."""
    global _CEILING
    prices = litellm.model_cost if litellm is not None else price_map.model_cost()
    key = (id(prices), len(prices))  # (a model registered meanwhile counts)
    if _CEILING is None or _CEILING[0] != key:
        highest_in = highest_out = 0.0
        for entry in prices.values():
            if isinstance(entry, dict) and entry.get("mode") in _TEXT_MODES:
                highest_in = max(highest_in, *(_rate(entry, name) for name in _INPUT))
                highest_out = max(highest_out, *(_rate(entry, name) for name in _OUTPUT))
        _CEILING = (key, (highest_in, highest_out))
    return _CEILING[1]


def _rate(entry: dict[str, Any], name: str) -> float:
    value = entry.get(name)
    return float(value) if isinstance(value, (int, float)) else 0.0
