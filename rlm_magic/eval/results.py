"""What an evaluation found: every item's result, and the table a person reads.

The table has a row per context size and method: items, accuracy with its 95% Wilson
interval, dollars, tokens and seconds an item, and accuracy per task. ``plot()`` draws
accuracy and cost against context length (matplotlib, if it is installed: it is not a
dependency). Every item, its answer and how it got there (``trajectory``: an
``RLMResult`` for the RLM, the calls for the others) is in ``items``; ``to_jsonl`` writes
them, a line each, so runs compare across models and days.
"""

from __future__ import annotations

import html
import json
import math
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from .._tables import html_table, text_table
from ..llm.usage import format_cost
from .tasks import size_label

Z95 = 1.959964  # the normal quantile of a two-sided 95% interval


@dataclass
class ItemResult:
    """One method's answer to one item, scored, with what it cost."""

    method: str
    task: str
    size: int  # tokens asked for (0: a custom task's item, as given)
    index: int
    question: str
    expected: Any
    answer: str | None
    score: float  # 0..1 (a partial score for set answers)
    error: str | None = None
    cost_usd: float | None = None
    input_tokens: int = 0
    output_tokens: int = 0
    calls: int = 0
    elapsed_s: float = 0.0
    context_tokens: int = 0
    notes: list[str] = field(default_factory=list)
    trajectory: Any = field(default=None, repr=False)

    @property
    def correct(self) -> bool:
        return self.score >= 1.0

    def to_dict(self) -> dict[str, Any]:
        data = {k: v for k, v in asdict(self).items() if k != "trajectory"}
        data["expected"] = _jsonable(self.expected)
        trajectory = self.trajectory
        to_dict = getattr(trajectory, "to_dict", None)
        data["trajectory"] = to_dict() if callable(to_dict) else _jsonable(trajectory)
        return data

    def trajectory_text(self) -> str:
        """How the method got its answer, as plain text."""
        trajectory = self.trajectory
        if trajectory is None:
            return "(no trajectory)"
        if isinstance(trajectory, dict):
            return "\n\n".join(
                f"-- {c['model']}\n{c['prompt']}\n>> {c['answer']}" for c in trajectory["calls"]
            )
        turns = getattr(trajectory, "trajectory", [])
        lines = []
        for turn in turns:
            lines.append(f"-- turn {turn.index}\n{turn.response}")
            lines.extend(f">>> output:\n{run.output}" for run in turn.code)
        return "\n".join(lines) or repr(trajectory)


def wilson(successes: float, n: int, z: float = Z95) -> tuple[float, float]:
    """The Wilson score interval of a proportion (partial scores count as fractions)."""
    if n == 0:
        return (0.0, 1.0)
    p = successes / n
    denominator = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denominator
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denominator
    return (max(0.0, centre - half), min(1.0, centre + half))


@dataclass
class Cell:
    """The items of one size and method, summed."""

    size: int
    method: str
    items: list[ItemResult]

    @property
    def n(self) -> int:
        return len(self.items)

    @property
    def accuracy(self) -> float:
        return sum(i.score for i in self.items) / self.n if self.items else 0.0

    @property
    def interval(self) -> tuple[float, float]:
        return wilson(sum(i.score for i in self.items), self.n)

    @property
    def cost_usd(self) -> float | None:
        costs = [i.cost_usd for i in self.items if i.cost_usd is not None]
        return sum(costs) if costs else None

    @property
    def tokens(self) -> int:
        return sum(i.input_tokens + i.output_tokens for i in self.items)

    @property
    def seconds_per_item(self) -> float:
        return sum(i.elapsed_s for i in self.items) / self.n if self.items else 0.0

    def task_accuracy(self, task: str) -> float | None:
        scores = [i.score for i in self.items if i.task == task]
        return sum(scores) / len(scores) if scores else None


class EvalResults:
    """Every finished item of an evaluation; items land here as they finish, so an
    interrupted evaluation still has what it had."""

    def __init__(self, settings: dict[str, Any] | None = None):
        self.items: list[ItemResult] = []
        self.settings = settings or {}  # models, seed, sizes: written with each item
        self.stopped: str | None = None  # why it ended early (an interrupt, the budget)
        self.elapsed_s = 0.0

    def add(self, item: ItemResult) -> None:
        self.items.append(item)

    def __len__(self) -> int:
        return len(self.items)

    def select(
        self, method: str | None = None, task: str | None = None, size: int | None = None
    ) -> list[ItemResult]:
        """The items of this method, task and size (any, where None), in the tasks'
        order, not the order they finished in (which concurrency decides)."""
        chosen = [
            i
            for i in self.items
            if (method is None or i.method == method)
            and (task is None or i.task == task)
            and (size is None or i.size == size)
        ]
        return sorted(chosen, key=_plan_order)

    @property
    def methods(self) -> list[str]:
        return _in_order(i.method for i in self.items)

    @property
    def tasks(self) -> list[str]:
        return _in_order(i.task for i in self.items)

    @property
    def sizes(self) -> list[int]:
        return sorted({i.size for i in self.items})

    def cells(self) -> list[Cell]:
        return [
            Cell(size, method, self.select(method=method, size=size))
            for size in self.sizes
            for method in self.methods
            if self.select(method=method, size=size)
        ]

    @property
    def cost_usd(self) -> float | None:
        costs = [i.cost_usd for i in self.items if i.cost_usd is not None]
        return sum(costs) if costs else None

    # -- the table ----------------------------------------------------------------------
    def _columns(self) -> tuple[str, ...]:
        return (
            "size",
            "method",
            "n",
            "accuracy (95% CI)",
            "cost",
            "tokens",
            "s/item",
        ) + tuple(self.tasks)

    def _rows(self) -> list[tuple[str, ...]]:
        rows = []
        for cell in self.cells():
            low, high = cell.interval
            rows.append(
                (
                    size_label(cell.size) if cell.size else "as given",
                    cell.method,
                    str(cell.n),
                    f"{cell.accuracy:.0%} ({low:.0%}-{high:.0%})",
                    format_cost(cell.cost_usd),
                    f"{cell.tokens:,}",
                    f"{cell.seconds_per_item:.1f}",
                )
                + tuple(_percent(cell.task_accuracy(task)) for task in self.tasks)
            )
        return rows

    def _footer(self) -> str:
        parts = [f"{len(self.items)} items", f"cost {format_cost(self.cost_usd)}"]
        if self.stopped:
            parts.append(f"stopped early: {self.stopped}")
        cut = sum(1 for i in self.items if i.notes and i.method == "direct")
        if cut:
            parts.append(f"{cut} direct calls had their context cut to the window")
        failed = sum(1 for i in self.items if i.error)
        if failed:
            parts.append(f"{failed} items failed (scored 0)")
        return "; ".join(parts)

    def __repr__(self) -> str:
        if not self.items:
            return "No evaluated items" + (f" (stopped: {self.stopped})" if self.stopped else "")
        return text_table(self._columns(), self._rows(), rule=True) + "\n" + self._footer()

    def _repr_html_(self) -> str:
        if not self.items:
            return f"<p>{html.escape(repr(self))}</p>"
        table = html_table(self._columns(), self._rows(), css_class="rlm-usage")
        return (
            table
            + f"<p>{html.escape(self._footer())}</p>"
            + "<details><summary>Every item, with its trajectory</summary>"
            + "".join(self._item_html(i) for i in sorted(self.items, key=_plan_order))
            + "</details>"
        )

    @staticmethod
    def _item_html(item: ItemResult) -> str:
        mark = "✓" if item.correct else ("~" if item.score > 0 else "✗")
        head = (
            f"{mark} {item.method} | {item.task} #{item.index} | "
            f"{size_label(item.size) if item.size else 'as given'} | "
            f"answer {item.answer if item.error is None else 'failed: ' + item.error!r:.120} | "
            f"expected {_jsonable(item.expected)!r:.80}"
        )
        return (
            f"<details><summary><code>{html.escape(head)}</code></summary>"
            f"<pre>{html.escape(_shortened(item.trajectory_text()))}</pre></details>"
        )

    # -- files and plots ----------------------------------------------------------------
    def to_jsonl(self, path: str | Path, append: bool = True) -> Path:
        """Every item as one JSON line (its trajectory included), with the settings."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("a" if append else "w", encoding="utf-8") as out:
            for item in self.items:
                out.write(json_line(item, self.settings))
        return path

    def plot(self) -> Any:
        """A matplotlib figure: accuracy and cost an item against context length, a line
        a method. None when matplotlib is not installed."""
        import importlib

        try:  # a Figure, not pyplot: no backend is chosen, no global figure is left
            Figure = importlib.import_module("matplotlib.figure").Figure
        except ImportError:
            return None
        figure = Figure(figsize=(9, 3.4))
        accuracy, cost = figure.subplots(1, 2)
        sizes = [s for s in self.sizes if s]
        for method in self.methods:
            cells = [Cell(s, method, self.select(method=method, size=s)) for s in sizes]
            cells = [c for c in cells if c.items]
            xs = [c.size for c in cells]
            accuracy.errorbar(
                xs,
                [c.accuracy for c in cells],
                yerr=[
                    [c.accuracy - c.interval[0] for c in cells],
                    [c.interval[1] - c.accuracy for c in cells],
                ],
                marker="o",
                capsize=3,
                label=method,
            )
            cost.plot(xs, [(c.cost_usd or 0.0) / c.n for c in cells], marker="o", label=method)
        for axes, label in ((accuracy, "accuracy"), (cost, "USD per item")):
            axes.set_xscale("log")
            axes.set_xlabel("context length (tokens)")
            axes.set_ylabel(label)
            axes.set_xticks(sizes, [size_label(s) for s in sizes])
        accuracy.set_ylim(-0.05, 1.05)
        accuracy.legend()
        figure.tight_layout()
        return figure

    def plot_png(self) -> bytes | None:
        """The plot as PNG bytes (what a notebook shows); None without matplotlib."""
        figure = self.plot()
        if figure is None:
            return None
        import io

        buffer = io.BytesIO()
        figure.savefig(buffer, format="png", dpi=90)
        return buffer.getvalue()


def json_line(item: ItemResult, settings: dict[str, Any]) -> str:
    return json.dumps({**settings, **item.to_dict()}, ensure_ascii=False, default=str) + "\n"


def _shortened(text: str, most: int = 800) -> str:
    """A trajectory's text as the table's details show it (each item's whole trajectory
    stays in ``items``, and in the JSON-lines file)."""
    if len(text) <= most:
        return text
    return f"{text[: most // 2]}\n[... {len(text) - most:,} characters ...]\n{text[-most // 2 :]}"


def warm_plot() -> None:
    """Import matplotlib's figure and renderer if it is installed (a second or so, the
    first time), so the plot is drawn as soon as the last answer is in."""
    import importlib
    import importlib.util

    if importlib.util.find_spec("matplotlib") is not None:
        importlib.import_module("matplotlib.figure")
        importlib.import_module("matplotlib.backends.backend_agg")


def _percent(value: float | None) -> str:
    return "" if value is None else f"{value:.0%}"


def _in_order(values: Iterable[str]) -> list[str]:
    return list(dict.fromkeys(values))


def _jsonable(value: Any) -> Any:
    if isinstance(value, (set, frozenset)):
        return sorted(value, key=str)
    if isinstance(value, tuple):
        return list(value)
    return value


def _plan_order(item: ItemResult) -> tuple[int, str, int, str]:
    """Items by size, task, item and method: a listing that does not change with the
    order concurrent items happened to finish in."""
    return (item.size, item.task, item.index, item.method)
