"""Running an evaluation: every method on every item, concurrently, through one ``RLM``.

Items run a few at a time (``concurrency``, default ``RLM.max_concurrency``; RLM runs at
most ``RLM_RUNS_AT_ONCE`` at once, each a sandbox process); their calls share the RLM's
client, so its concurrency limit, rate gates and cache hold across methods. Every call
is recorded in the evaluation's ledger, a child of the RLM's (so ``usage()`` and
``RLM.max_session_cost_usd`` see it), with one ledger per item below it: an item's cost
is what its ledger recorded, and the table's totals are the evaluation ledger's.
``max_cost_usd`` is a budget on that ledger: no call is sent that could pass it, and once
one is refused no new item starts.

Items are generated when first asked (a 1M-token context in a thread, off the loop),
shared by the methods, and dropped once every method has answered. Results land in
``Evaluation.results`` as they finish (and in the JSON-lines file, if one is given), so
an interrupt keeps every finished item.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from ..errors import BudgetExceededError, describe_exception
from ..llm.budget import CostBudget
from ..llm.usage import UsageLedger
from . import methods as methods_module
from . import tasks as tasks_module
from .methods import Answer, Method
from .plan import EvalPlan, make_plan
from .results import EvalResults, ItemResult, json_line, warm_plot
from .tasks import Item, Task, estimate_tokens, parse_size

if TYPE_CHECKING:
    from ..rlm.runner import RLM

RLM_RUNS_AT_ONCE = 8
BUDGET_SETTING = "evaluate(max_cost_usd)"
_OFF_LOOP_TOKENS = 50_000  # items larger than this are generated in a thread


class Observer(Protocol):
    """What the evaluation reports as it goes (a ``BatchProgress`` fits)."""

    def item_started(self, index: int) -> None: ...
    def item_finished(self, index: int, result: Any) -> None: ...
    def item_failed(self, index: int, error: BaseException) -> None: ...


@dataclass(frozen=True)
class Unit:
    """One method on one item."""

    task: Task
    size: int
    index: int
    method: Method


class Evaluation:
    """An evaluation, planned and ready to run (``await evaluation.run()``);
    ``results`` holds what has finished, also after an interrupt."""

    def __init__(
        self,
        rlm: RLM,
        tasks: Any = None,
        sizes: Sequence[int | str] | str = ("8k", "32k"),
        n: int = 10,
        methods: Any = None,
        *,
        seed: int = 0,
        max_cost_usd: float | None = None,
        concurrency: int | None = None,
        jsonl: str | Path | None = None,
        chunk_tokens: int | None = None,
    ):
        if isinstance(sizes, str):
            sizes = [s for s in sizes.split(",") if s.strip()]
        self.rlm = rlm
        self.tasks = tasks_module.resolve(tasks)
        self.sizes = [parse_size(s) for s in sizes]
        self.n = n
        self.methods = methods_module.resolve(methods, chunk_tokens)
        self.seed = seed
        self.concurrency = concurrency or rlm.max_concurrency
        self.jsonl = Path(jsonl) if jsonl is not None else None
        self.plan: EvalPlan = make_plan(rlm, self.tasks, self.sizes, n, self.methods)
        self.ledger = UsageLedger(parent=rlm.client.ledger)
        if max_cost_usd is not None:
            self.ledger.budget = CostBudget(self.ledger, max_cost_usd, BUDGET_SETTING)
        self.units = self._units()
        self.results = EvalResults(
            {
                "model": rlm.model,
                "sub_model": rlm.effective_sub_model,
                "seed": seed,
                "started": time.strftime("%Y-%m-%dT%H:%M:%S"),
            }
        )
        self._items: dict[tuple[str, int, int], asyncio.Future[Item]] = {}
        self._uses: dict[tuple[str, int, int], int] = {}

    def _units(self) -> list[Unit]:
        units: list[Unit] = []
        generated = [t for t in self.tasks if t.fixed_items is None]
        fixed = [t for t in self.tasks if t.fixed_items is not None]
        for size in self.sizes:
            for task in generated:
                for index in range(self.n):
                    units.extend(Unit(task, size, index, m) for m in self.methods)
        for task in fixed:
            for index in range(task.count(self.n)):
                units.extend(Unit(task, 0, index, m) for m in self.methods)
        return units

    async def run(self, observer: Observer | None = None) -> EvalResults:
        started = time.perf_counter()
        slots = asyncio.Semaphore(self.concurrency)
        rlm_slots = asyncio.Semaphore(min(self.concurrency, RLM_RUNS_AT_ONCE))
        for unit in self.units:
            key = (unit.task.name, unit.size, unit.index)
            self._uses[key] = self._uses.get(key, 0) + 1
        tasks = [
            asyncio.ensure_future(self._run_unit(position, unit, slots, rlm_slots, observer))
            for position, unit in enumerate(self.units)
        ]
        # The plot's library loads while the items run (a thread: the loop goes on).
        warming = asyncio.ensure_future(asyncio.to_thread(warm_plot))
        try:
            await asyncio.gather(*tasks)
        except BaseException:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            self.results.stopped = self.results.stopped or "interrupted"
            raise
        finally:
            self.results.elapsed_s = time.perf_counter() - started
            self._items.clear()
            if not warming.done():
                warming.cancel()  # (the thread finishes its import on its own)
            elif not warming.cancelled():
                warming.exception()  # a failed import means no plot, nothing more
        return self.results

    async def _run_unit(
        self,
        position: int,
        unit: Unit,
        slots: asyncio.Semaphore,
        rlm_slots: asyncio.Semaphore,
        observer: Observer | None,
    ) -> None:
        async with slots:
            if unit.method.name == "rlm":
                async with rlm_slots:
                    await self._answer(position, unit, observer)
            else:
                await self._answer(position, unit, observer)

    async def _answer(self, position: int, unit: Unit, observer: Observer | None) -> None:
        key = (unit.task.name, unit.size, unit.index)
        if self.results.stopped:
            self._used(key)
            return
        if observer is not None:
            observer.item_started(position)
        item = await self._item(unit.task, unit.size, unit.index)
        ledger = UsageLedger(parent=self.ledger)
        started = time.perf_counter()
        try:
            answer = await unit.method.answer(item, self.rlm, ledger)
        except BudgetExceededError as exc:
            answer = Answer(None, describe_exception(exc))
        except Exception as exc:  # noqa: BLE001 - an item's failure is its result
            answer = Answer(None, describe_exception(exc))
        finally:
            self._used(key)
        elapsed = time.perf_counter() - started
        result = self._scored(unit, item, answer, ledger, elapsed)
        self.results.add(result)
        if self.jsonl is not None:
            with self.jsonl.open("a", encoding="utf-8") as out:
                out.write(json_line(result, self.results.settings))
        if answer.error is not None and BUDGET_SETTING in answer.error:
            self.results.stopped = f"the cost budget ({BUDGET_SETTING}) had no room left"
        if observer is not None:
            if answer.error is not None:
                observer.item_failed(position, RuntimeError(answer.error))
            else:
                observer.item_finished(position, result)

    def _scored(
        self, unit: Unit, item: Item, answer: Answer, ledger: UsageLedger, elapsed: float
    ) -> ItemResult:
        notes = list(answer.notes)
        score = 0.0
        if answer.text is not None:
            try:
                score = float(item.scorer(answer.text, item.expected))
            except Exception as exc:  # noqa: BLE001 - a user's scorer that failed scores 0
                notes.append(f"the scorer failed: {describe_exception(exc)}")
        usage = ledger.summary().total
        return ItemResult(
            method=unit.method.name,
            task=item.task,
            size=item.size,
            index=item.index,
            question=item.question,
            expected=item.expected,
            answer=answer.text,
            score=score,
            error=answer.error,
            cost_usd=usage.cost_usd,
            input_tokens=usage.input_tokens,
            output_tokens=usage.output_tokens,
            calls=usage.calls,
            elapsed_s=elapsed,
            context_tokens=estimate_tokens(item.context),
            notes=notes,
            trajectory=answer.trajectory,
        )

    async def _item(self, task: Task, size: int, index: int) -> Item:
        key = (task.name, size, index)
        future = self._items.get(key)
        if future is None:
            made: asyncio.Future[Item]
            if size > _OFF_LOOP_TOKENS:
                made = asyncio.ensure_future(asyncio.to_thread(task.make, size, index, self.seed))
            else:
                made = asyncio.get_running_loop().create_future()
                made.set_result(task.make(size, index, self.seed))
            future = self._items[key] = made
        return await asyncio.shield(future)

    def _used(self, key: tuple[str, int, int]) -> None:
        self._uses[key] -= 1
        if self._uses[key] <= 0:
            self._items.pop(key, None)  # every method has it: its context can go


async def evaluate(  # noqa: PLR0913 - a user's call: its options are one list
    rlm: RLM,
    tasks: Any = None,
    sizes: Sequence[int | str] | str = ("8k", "32k"),
    n: int = 10,
    methods: Any = None,
    *,
    seed: int = 0,
    max_cost_usd: float | None = None,
    concurrency: int | None = None,
    jsonl: str | Path | None = None,
    chunk_tokens: int | None = None,
    dry_run: bool = False,
    observer: Observer | None = None,
) -> EvalResults | EvalPlan:
    """Evaluate ``methods`` ("rlm", "direct", "map") on ``tasks`` (names, or ``Task``s
    such as ``custom_task(...)``) at ``sizes`` (tokens: 8000, "8k", "1M"), ``n`` items
    each, through ``rlm``'s settings, client and budgets. Returns ``EvalResults`` (its
    table shows in a notebook; ``.plot()``, ``.items``, ``.to_jsonl(path)``).

    ``dry_run=True``: return the plan (calls, tokens, estimated cost), sending nothing.
    ``max_cost_usd``: no call is sent that could take the evaluation past it.
    ``jsonl``: append each item to this file as it finishes.
    To keep the finished items through an interrupt, use ``Evaluation`` (its ``results``
    fill as items finish)."""
    evaluation = Evaluation(
        rlm,
        tasks,
        sizes,
        n,
        methods,
        seed=seed,
        max_cost_usd=max_cost_usd,
        concurrency=concurrency,
        jsonl=jsonl,
        chunk_tokens=chunk_tokens,
    )
    if dry_run:
        return evaluation.plan
    return await evaluation.run(observer)
