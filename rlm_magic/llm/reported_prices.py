"""What the costs a model's calls report teach about its price, when litellm has none.

A model litellm's price map does not list may still have its calls' costs reported: a
LiteLLM Proxy prices each call with its upstream's price and says so in a header
(``x-litellm-response-cost``). Each reported cost bounds the model's rates at that
endpoint (``learn``), so its next calls can be held to a budget as a priced model's
are. What is learned is kept in ``profiles`` (a ``ReportedPrice`` per model and
endpoint: a proxy prices a name its own way), read through ``LearnedPrices``, and
forgotten with everything else by ``profiles.forget()``.
"""

from __future__ import annotations

from typing import Protocol

from .profiles import ModelProfile, ReportedPrice
from .usage import CallRecord

# Output rate at most this many times the input rate, when learning a model's rates from
# reported costs: of litellm's 3,323 priced chat models, all but 3 (data errors, at 120x)
# charge at most 20x.
OUTPUT_RATIO = 20


class LearnedPrices(Protocol):
    """What a budget reads and writes of what this process learned about models
    (``profiles.PROFILES``; a test may give a fresh one)."""

    def reported_price(self, endpoint: str | None, model: str) -> ReportedPrice:
        """What reported costs taught of ``model``'s price at ``endpoint``."""
        ...

    def model(self, name: str) -> ModelProfile:
        """What was learned of model ``name`` (its tokenizer's loading)."""
        ...


def learn(price: ReportedPrice, record: CallRecord) -> None:
    """Bound a model's rates by a reported cost ``c`` of ``i`` uncached input and ``o``
    output tokens: ``c >= in_rate * i + out_rate * o``, so ``in_rate <= c / i`` and
    ``out_rate <= c / o``, and at most ``OUTPUT_RATIO * in_rate`` (a short answer
    bounds it loosely). The highest bounds seen are kept: a larger prompt may be
    priced higher (tiers). Sound for prices by the token; a fee per call is not.
    A call that ended without error and without a cost says its costs are not
    reported at all (unless one was before)."""
    cost = record.cost_usd
    if not cost or cost <= 0:
        if record.error is None and price.rates is None:
            price.unreported = True
        return
    uncached = max(record.input_tokens - record.cached_input_tokens, 1)
    in_rate = cost / uncached
    out_rate = OUTPUT_RATIO * in_rate
    if record.output_tokens > 0:
        out_rate = min(out_rate, cost / record.output_tokens)
    if price.rates is not None:
        in_rate, out_rate = max(in_rate, price.rates[0]), max(out_rate, price.rates[1])
    price.rates, price.unreported = (in_rate, out_rate), False
