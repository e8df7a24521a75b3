"""The usage ledger: tokens, dollars, retries and errors of every model call.

A ledger is append-only and safe to share between concurrent tasks (and threads).
A run's ledger forwards each record to its parent, so the session ledger always
holds the totals of everything, while each run can still report its own. Totals count
every call; the records themselves, the latest ``KEPT_RECORDS`` (a kernel's ledger
lives as long as the kernel, and a map of a million prompts would keep a million).
"""

from __future__ import annotations

import threading
from collections import deque
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from .._tables import html_table, text_table

# Records a ledger keeps (its totals count them all): ~0.7 KB each.
KEPT_RECORDS = 20_000

# The ``error`` of a call that was cancelled (an interrupt, a cancelled task): counted
# apart from failures, since nothing went wrong with the model or the request.
CANCELLED = "cancelled"


@dataclass(frozen=True)
class CallRecord:
    """One model call, as it ended."""

    model: str
    input_tokens: int = 0
    output_tokens: int = 0
    cost_usd: float | None = None  # None: litellm does not know this model's price
    retries: int = 0
    error: str | None = None
    elapsed_s: float = 0.0
    cached: bool = False
    rate_limited: int = 0  # 429 answers this call waited out (not counted as retries)
    # Input tokens the provider's prompt cache served (part of input_tokens), tokens
    # written to it, and the dollars caching saved on this call (None: unpriced).
    cached_input_tokens: int = 0
    cache_write_tokens: int = 0
    cache_saved_usd: float | None = 0.0
    cut_off: bool = False  # the answer stopped at max_tokens (finish_reason "length")


@dataclass
class ModelUsage:
    """Totals of the calls to one model (or of all calls, with ``model="total"``)."""

    model: str
    calls: int = 0
    cache_hits: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    cost_usd: float | None = None
    unpriced_calls: int = 0
    retries: int = 0
    errors: int = 0
    cancelled: int = 0
    elapsed_s: float = 0.0
    rate_limited: int = 0
    cached_input_tokens: int = 0
    cache_write_tokens: int = 0
    cache_saved_usd: float = 0.0
    cut_off: int = 0  # answers that stopped at max_tokens
    unpriced_savings: int = 0  # calls served from a prompt cache at no known price

    def add(self, record: CallRecord) -> None:
        self.calls += 1
        if record.cache_saved_usd is None and (
            record.cached_input_tokens or record.cache_write_tokens
        ):
            self.unpriced_savings += 1
        self.cut_off += record.cut_off
        self.cached_input_tokens += record.cached_input_tokens
        self.cache_write_tokens += record.cache_write_tokens
        self.cache_saved_usd += record.cache_saved_usd or 0.0
        self.rate_limited += record.rate_limited
        self.cache_hits += record.cached
        self.input_tokens += record.input_tokens
        self.output_tokens += record.output_tokens
        self.retries += record.retries
        if record.error == CANCELLED:
            self.cancelled += 1
        else:
            self.errors += record.error is not None
        self.elapsed_s += record.elapsed_s
        if record.cost_usd is None:
            # A failed call that got no response is not billed; an answered call
            # without a known price is, at a rate we cannot see.
            if record.error is None:
                self.unpriced_calls += 1
        else:
            self.cost_usd = (self.cost_usd or 0.0) + record.cost_usd

    @property
    def total_tokens(self) -> int:
        return self.input_tokens + self.output_tokens


@dataclass
class UsageSummary:
    """Per-model totals plus a grand total; what ``rlm_magic.usage()`` returns."""

    by_model: dict[str, ModelUsage] = field(default_factory=dict)
    total: ModelUsage = field(default_factory=lambda: ModelUsage("total"))

    def add(self, record: CallRecord) -> None:
        row = self.by_model.get(record.model)
        if row is None:  # (not setdefault: that builds a row for every record)
            row = self.by_model[record.model] = ModelUsage(record.model)
        row.add(record)
        self.total.add(record)

    def copy(self) -> UsageSummary:
        return UsageSummary(
            {name: replace(row) for name, row in self.by_model.items()}, replace(self.total)
        )

    # Shorthands for the numbers people ask for most.
    @property
    def calls(self) -> int:
        return self.total.calls

    @property
    def input_tokens(self) -> int:
        return self.total.input_tokens

    @property
    def output_tokens(self) -> int:
        return self.total.output_tokens

    @property
    def cost_usd(self) -> float | None:
        return self.total.cost_usd

    def to_dict(self) -> dict[str, Any]:
        return {
            "by_model": {name: asdict(row) for name, row in self.by_model.items()},
            "total": asdict(self.total),
        }

    _COLUMNS = (
        "model",
        "calls",
        "cache hits",
        "input tokens",
        "output tokens",
        "cost (USD)",
        "retries",
        "errors",
        "cancelled",
    )

    @property
    def _columns(self) -> tuple[str, ...]:
        # Rate limits are waited out, not failures; the column shows once they happen.
        # So do the prompt cache's: once a provider served cached input.
        return (
            self._COLUMNS
            + (("rate limited",) if self.total.rate_limited else ())
            + (("cut off",) if self.total.cut_off else ())
            + (("cached input", "cache saved") if self._cache_columns else ())
        )

    @property
    def _cache_columns(self) -> bool:
        return bool(self.total.cached_input_tokens or self.total.cache_write_tokens)

    def _rows(self) -> list[tuple[str, ...]]:
        rows = [self._cells(row) for row in self.by_model.values()]
        if len(self.by_model) != 1:
            rows.append(self._cells(self.total))
        return rows

    def _cells(self, row: ModelUsage) -> tuple[str, ...]:
        cells: tuple[str, ...] = (
            row.model,
            str(row.calls),
            str(row.cache_hits),
            f"{row.input_tokens:,}",
            f"{row.output_tokens:,}",
            format_cost(row.cost_usd, row.unpriced_calls),
            str(row.retries),
            str(row.errors),
            str(row.cancelled),
        )
        cells += (str(row.rate_limited),) if self.total.rate_limited else ()
        cells += (str(row.cut_off),) if self.total.cut_off else ()
        if self._cache_columns:
            cells += (
                f"{row.cached_input_tokens:,}",
                format_saving(row.cache_saved_usd, row.unpriced_savings),
            )
        return cells

    def __repr__(self) -> str:
        if not self.by_model:
            return "No LLM calls yet."
        return text_table(self._columns, self._rows(), rule=True)

    def _repr_html_(self) -> str:
        if not self.by_model:
            return "<p>No LLM calls yet.</p>"
        rows = self._rows()
        total = len(self.by_model) > 1  # the last row is the total, in bold
        classes = [None] * (len(rows) - 1) + ["rlm-total"] if total else []
        return html_table(self._columns, rows, css_class="rlm-usage", row_classes=classes)


def format_cost(cost: float | None, unpriced_calls: int = 0) -> str:
    """Dollars for display; '?' marks calls whose price litellm does not know. With no
    priced answer yet (none arrived, or every call failed) the cost is unknown, never a
    false $0."""
    if cost is None:
        return "?"
    if 0 < cost < 0.00005:
        text = "<$0.0001"  # a paid call is never rounded down to a free-looking $0.0000
    else:
        text = f"${cost:.4f}" if cost < 100 else f"${cost:,.2f}"
    return text + (" + ?" if unpriced_calls else "")


def format_saving(dollars: float, unpriced: int = 0) -> str:
    """What prompt caching saved; negative while cache writes cost more than reads saved.
    ``unpriced``: cached calls at no known price, whose saving is unknown, never $0."""
    if unpriced and not dollars:
        return "?"
    text = format_cost(abs(dollars), unpriced)
    return ("-" + text) if dollars < 0 else text


class UsageLedger:
    """Thread-safe, append-only record of model calls; forwards to its parent.

    Totals are kept as records arrive: budgets read them before every call and the
    status panel reads them a few times a second, so neither re-adds the whole history.
    """

    def __init__(self, parent: UsageLedger | None = None):
        self.parent = parent
        # The cost budget on what this ledger records (a ``budget.CostBudget``), if any.
        self.budget: Any = None
        self._records: deque[CallRecord] = deque(maxlen=KEPT_RECORDS)
        self._totals = UsageSummary()
        self._lock = threading.Lock()

    def record(self, record: CallRecord) -> None:
        with self._lock:
            self._records.append(record)
            self._totals.add(record)
        if self.parent is not None:
            self.parent.record(record)

    @property
    def records(self) -> list[CallRecord]:
        """The latest records, oldest first (at most ``KEPT_RECORDS``; ``len`` counts
        them all)."""
        with self._lock:
            return list(self._records)

    def summary(self) -> UsageSummary:
        with self._lock:
            return self._totals.copy()

    @property
    def cost_usd(self) -> float:
        """Known cost so far (unpriced calls count as 0): what budgets count as spent."""
        with self._lock:
            return self._totals.total.cost_usd or 0.0

    def clear(self) -> None:
        with self._lock:
            self._records.clear()
            self._totals = UsageSummary()

    def __len__(self) -> int:
        """Records made, kept or not (each counts one call in the totals)."""
        return self._totals.total.calls


# Every call of the session, whichever RLM or helper made it: what usage() reports.
SESSION_LEDGER = UsageLedger()


def usage() -> UsageSummary:
    """Totals per model of every LLM call made in this session."""
    return SESSION_LEDGER.summary()
