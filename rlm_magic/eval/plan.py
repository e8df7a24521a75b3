"""The plan of an evaluation: how many calls, tokens and dollars it should take, worked
out before anything is sent (what a dry run shows, and what the runner checks against
``max_cost_usd`` before it starts).

The figures are estimates: sizes are in estimated tokens, an answer is reckoned at
``ANSWER_TOKENS``, and an RLM run at a few root turns plus a sub-call per chunk (the model
decides what it really does). Prices are those litellm's price map gives the models.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .._tables import html_table, text_table
from ..llm.litellm_loader import loaded_litellm
from ..llm.price_map import names_of
from ..llm.pricing import price_entry
from ..llm.usage import format_cost
from .tasks import Task, estimate_tokens, size_label

if TYPE_CHECKING:
    from ..rlm.runner import RLM
    from .methods import Method


@dataclass(frozen=True)
class PlanRow:
    size: int
    method: str
    items: int
    calls: int
    input_tokens: int
    output_tokens: int
    cost_usd: float | None  # None: a model it uses has no known price


class EvalPlan:
    """What an evaluation will send; ``repr`` is the dry run's table."""

    def __init__(self, rows: list[PlanRow], unpriced: set[str]):
        self.rows = rows
        self.unpriced = unpriced

    @property
    def items(self) -> int:
        return sum(r.items for r in self.rows)

    @property
    def calls(self) -> int:
        return sum(r.calls for r in self.rows)

    @property
    def cost_usd(self) -> float | None:
        if self.unpriced:
            return None
        return sum(r.cost_usd or 0.0 for r in self.rows)

    def _cells(self) -> tuple[tuple[str, ...], list[tuple[str, ...]]]:
        columns = ("size", "method", "items", "calls", "input tokens", "output tokens", "cost")
        rows: list[tuple[str, ...]] = [
            (
                size_label(r.size) if r.size else "as given",
                r.method,
                str(r.items),
                f"~{r.calls:,}",
                f"~{r.input_tokens:,}",
                f"~{r.output_tokens:,}",
                "?" if r.cost_usd is None else "~" + format_cost(r.cost_usd),
            )
            for r in self.rows
        ]
        return columns, rows

    def summary(self) -> str:
        cost = "unknown" if self.cost_usd is None else f"~{format_cost(self.cost_usd)}"
        text = f"Plan: {self.items} items, ~{self.calls:,} calls, {cost} (estimated)."
        if self.unpriced:
            text += f" No price known for {', '.join(sorted(self.unpriced))}."
        return text

    def __repr__(self) -> str:
        columns, rows = self._cells()
        return text_table(columns, rows, rule=True) + "\n" + self.summary()

    def _repr_html_(self) -> str:
        columns, rows = self._cells()
        return html_table(columns, rows, css_class="rlm-usage") + f"<p>{self.summary()}</p>"


def rates(model: str) -> tuple[float, float] | None:
    """Dollars per input and output token of ``model``, if the price map knows them."""
    entry = price_entry(loaded_litellm(), names_of(model))
    if entry is None:
        return None
    return float(entry.get("input_cost_per_token") or 0.0), float(
        entry.get("output_cost_per_token") or 0.0
    )


def make_plan(
    rlm: RLM, tasks: Sequence[Task], sizes: Sequence[int], n: int, methods: Sequence[Method]
) -> EvalPlan:
    rows: list[PlanRow] = []
    unpriced: set[str] = set()
    question = 60  # tokens of a task's question, about
    fixed = [t for t in tasks if t.fixed_items is not None]
    generated = [t for t in tasks if t.fixed_items is None]
    groups: list[tuple[int, list[int]]] = [(s, [s] * len(generated) * n) for s in sizes]
    if fixed:  # a custom task's items: once, at their own size
        own = [estimate_tokens(i.context) for t in fixed for i in t.items(0, n)]
        groups.append((0, own))
    for size, item_sizes in groups:
        if not item_sizes:
            continue
        for method in methods:
            calls = tokens_in = tokens_out = 0
            cost: float | None = 0.0
            for item_size in item_sizes:
                estimate = method.estimate(item_size, question, rlm)
                calls += estimate.calls
                tokens_in += estimate.input_tokens
                tokens_out += estimate.output_tokens
                for model, model_in, model_out in estimate.models:
                    price = rates(model)
                    if price is None:
                        unpriced.add(model)
                        cost = None
                    elif cost is not None:
                        cost += model_in * price[0] + model_out * price[1]
            rows.append(
                PlanRow(size, method.name, len(item_sizes), calls, tokens_in, tokens_out, cost)
            )
    return EvalPlan(rows, unpriced)
