"""The awaitable helpers put into the notebook: ``llm_query``, ``llm_query_batch``,
``rlm_query``, ``rlm_query_batch`` (and the ``_batched`` aliases), and ``amap``, which
maps any async function of the user's (a pipeline of calls per row) the same way.

They are coroutine functions bound to one ``RLM`` (its settings, client and ledger), so
``await llm_query_batch(prompts)`` in a cell runs every prompt concurrently on the
kernel's own loop. Given a pandas Series, the maps hand back a Series on its index.

Why one module: the helpers are one surface, the notebook's, and share its rules (the
bar, the interrupt, the last unfinished batch, a Series in and out); each is short, and
their docstrings, read side by side, are what ``help()`` and the API reference show.
"""

from __future__ import annotations

import contextlib
import dataclasses
import sys
from collections.abc import Awaitable, Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any, cast

from ..errors import APIKeyError, ConfigError, interrupt
from ..llm.completion import CutAnswer, partial_answer
from ..llm.limiter import ConcurrencyLimiter
from ..llm.messages import Messages, as_prompt_list, build_messages, check_max_tokens
from ..llm.structured import AnswerFormat, ask
from ..llm.usage import UsageLedger
from ..maps.function_map import map_function, map_ledger
from ..maps.gather import BatchOutcome, gather_limited
from ..maps.items import map_items
from ..maps.run_map import MapOutcome, MapSpec, run_map
from ..repl.helpers import bound_to
from ..rlm.runner import RLM
from . import unfinished
from .interrupts import run_interruptibly
from .progress import BatchProgress
from .unfinished import UnfinishedBatch
from .unfinished import failed_batch as failed_batch  # (the package's, deprecated)
from .unfinished import interrupted_batch as interrupted_batch  # (deprecated)
from .unfinished import unfinished_batch as unfinished_batch  # (the package's)

if TYPE_CHECKING:
    from ..llm.client import LLMClient


class NotebookHelpers:
    """The helpers as a user sees them in the notebook, bound to one ``RLM``."""

    def __init__(self, rlm: RLM):
        self.rlm = rlm

    @property
    def client(self) -> LLMClient:
        return self.rlm.client

    async def llm_query(
        self,
        prompt: str,
        *,
        system: str | None = None,
        model: str | None = None,
        max_tokens: int | None = None,
        response_format: Any = None,
    ) -> Any:
        """Ask a model one question and return its answer.

        Uses ``RLM.sub_model`` unless ``model`` is given. Raises ``LLMQueryError``
        (naming the model and the cause) when the call fails after its retries.
        ``response_format`` (a pydantic model class or a JSON schema) makes the answer a
        validated object: an instance of the model, or a dict.
        """
        check_max_tokens(max_tokens, "llm_query")
        messages = build_messages(prompt, system)
        if response_format is not None:
            answer_format = AnswerFormat(response_format)
            typed = await run_interruptibly(
                ask(
                    self.client.complete,
                    messages,
                    answer_format,
                    model or self.rlm.effective_sub_model,
                    model=model,
                    max_tokens=max_tokens,
                    ledger=map_ledger(),
                    stream=True,
                ),
                "llm_query",
            )
            return typed.value
        try:
            completion = await run_interruptibly(
                # Streamed (RLM.stream): a slow answer is timed out on a stall, not its length.
                self.client.complete(
                    messages, model=model, max_tokens=max_tokens, ledger=map_ledger(), stream=True
                ),
                "llm_query",
            )
        except KeyboardInterrupt as stop:
            _keep_interrupted_answer(stop)
            raise
        return completion.text

    async def llm_query_batch(
        self,
        prompts: Iterable[str],
        *,
        system: str | None = None,
        model: str | None = None,
        max_tokens: int | None = None,
        return_exceptions: bool = False,
        batch_job: bool = False,
        resume: bool | None = None,
        response_format: Any = None,
    ) -> Any:  # a list, or a pandas Series given one
        """Ask many questions concurrently; answers come back in the prompts' order.

        At most ``RLM.max_concurrency`` requests are in flight. If any item fails,
        raises ``BatchError`` carrying ``.results`` (None where an item failed) and
        ``.errors``; with ``return_exceptions=True`` the exceptions sit in place instead.

        ``batch_job=True`` runs the prompts as one provider batch job instead (OpenAI,
        Azure, Vertex, Bedrock, Mistral, a LiteLLM Proxy): within 24 hours, at the
        provider's batch price. Re-running the same call reattaches to the job.

        ``resume``: keep answers on disk (under ``RLM.cache_dir``) as they arrive, so
        running the same map again after an interrupt or a restart sends only the
        prompts still unanswered. On by default for maps of 100 prompts or more
        (``resume=None``); the file goes once every prompt has its answer.

        ``response_format`` (a pydantic model class or a JSON schema): every answer is a
        validated object; one that fails validation twice is that item's error.

        Given a pandas Series of prompts, returns a Series with its index and name.
        """
        items = map_items(prompts, "llm_query_batch", prompts=True)
        prompts = as_prompt_list(items.values, "llm_query_batch")
        check_max_tokens(max_tokens, "llm_query_batch")
        conversations = [build_messages(p, system, caller="llm_query_batch") for p in prompts]
        spec = MapSpec(
            model=model,
            max_tokens=max_tokens,
            answer_format=AnswerFormat(response_format) if response_format is not None else None,
            resume=resume,
            batch_job=batch_job,
            ledger=map_ledger(),  # inside an amap's function: that map's too
        )
        if batch_job:
            if not conversations:
                return items.shaped([])
            return items.shaped(await self._batch_job(conversations, spec, return_exceptions))
        total = len(prompts)
        progress = BatchProgress(
            total,
            "llm_query_batch",
            enabled=self.rlm.progress and total > 1,
            hold=self.client.gate(model).hold_message,
        )
        outcome = MapOutcome(total)
        with progress, _kept_on_interrupt(outcome, "llm_query_batch"):
            answers, errors = await run_interruptibly(
                run_map(self.client, conversations, spec, progress, outcome)
            )
        return items.shaped(
            _collect(answers, errors, return_exceptions, "llm_query_batch", outcome.never_sent())
        )

    async def _batch_job(
        self, conversations: list[Messages], spec: MapSpec, return_exceptions: bool
    ) -> list[Any]:
        from .job_progress import JobProgress, still_running

        progress = JobProgress(len(conversations), "llm_query_batch", enabled=self.rlm.progress)
        outcome = MapOutcome(len(conversations))
        try:
            with progress:
                answers, errors = await run_interruptibly(
                    run_map(self.client, conversations, spec, progress, outcome),
                    "llm_query_batch",
                )
        except KeyboardInterrupt:
            record = outcome.job.record if outcome.job is not None else None
            if record is None or record.ended:
                raise
            raise interrupt(still_running(record)) from None
        return _collect(answers, errors, return_exceptions)

    async def rlm_query(self, prompt: str, context: Any = None) -> str:
        """Run a child RLM on ``context`` and return its final answer (a str)."""
        result = await run_interruptibly(self.rlm.arun(prompt, context=context), "rlm_query")
        if not result.success:
            raise result.as_exception()
        return cast(str, result.final_answer)  # a successful run has an answer

    async def rlm_query_batch(
        self,
        prompts: Iterable[str],
        contexts: Iterable[Any] | None = None,
        *,
        return_exceptions: bool = False,
    ) -> Any:  # a list, or a pandas Series given one
        """Run one child RLM per prompt, concurrently; answers in the prompts' order (a
        Series on the prompts' index, given a Series)."""
        items = map_items(prompts, "rlm_query_batch", prompts=True)
        prompts = as_prompt_list(items.values, "rlm_query_batch")
        contexts = [None] * len(prompts) if contexts is None else list(contexts)
        if len(contexts) != len(prompts):
            raise ConfigError(
                f"rlm_query_batch got {len(prompts)} prompts but {len(contexts)} contexts"
            )
        # Child runs hold no client slot while they think (their own calls take slots),
        # so they get a limiter of their own: sharing one could deadlock.
        limiter = ConcurrencyLimiter(lambda: self.rlm.max_concurrency)
        calls = [(lambda p=p, c=c: self.rlm_query(p, c)) for p, c in zip(prompts, contexts)]
        progress = BatchProgress(
            len(prompts), "rlm_query_batch", enabled=self.rlm.progress and len(prompts) > 1
        )
        outcome = BatchOutcome(len(prompts))
        with progress, _kept_on_interrupt(outcome, "rlm_query_batch"):
            results, errors = await run_interruptibly(
                gather_limited(calls, limiter, progress, outcome)
            )
        return items.shaped(
            _collect(results, errors, return_exceptions, "rlm_query_batch", outcome.never_sent())
        )

    async def amap(
        self,
        fn: Callable[[Any], Awaitable[Any]],
        items: Iterable[Any],
        *,
        concurrency: int | None = None,
        return_exceptions: bool = False,
        resume: bool | None = None,
    ) -> Any:
        """Await ``fn(item)`` for every item, concurrently; results in the items' order.

        ``fn`` is any async function of one item, e.g. two calls a row::

            async def per_row(row):
                facts = await llm_query(f"List the facts in: {row}")
                return await llm_query(f"Summarise: {facts}")

            summaries = await amap(per_row, rows)

        The calls ``fn`` makes count in the usage and costs, and take the client's
        slots as any call does. At most ``concurrency`` (default ``RLM.max_concurrency``)
        functions run at once, under a limit of their own, so functions waiting for a
        slot for their calls never hold one. If any item fails, raises ``BatchError``
        (``.results``, None where an item failed, and ``.errors``); with
        ``return_exceptions=True`` the exceptions sit in place instead. Interrupted, the
        results that had arrived are in ``rlm_magic.unfinished_batch().results``.

        ``resume``: keep each result that is JSON on disk as it arrives (on by default
        from 100 items), so running the same map again calls ``fn`` only on the items
        still without one. The map is known by ``fn`` (its source, and the plain values
        and functions it reads), the items and the sub-model's settings.

        Given a pandas Series, ``fn`` gets its values and the results come back as a
        Series on its index; given a DataFrame, ``fn`` gets each row (a Series, as in
        ``df.apply(fn, axis=1)``) and the results come back on the frame's index.
        """
        listed = map_items(items, "amap")
        if not callable(fn):
            raise ConfigError(
                f"amap(fn, items): fn must be an async function of one item, "
                f"got a {type(fn).__name__}"
            )
        if concurrency is not None and (
            isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1
        ):
            raise ConfigError(f"amap: concurrency must be a positive int, got {concurrency!r}")
        limiter = ConcurrencyLimiter(lambda: concurrency or self.rlm.max_concurrency)
        total = len(listed.values)
        # The map's own ledger, under the client's (or an enclosing map's): its bar
        # counts the calls its function makes, not those made elsewhere meanwhile.
        ledger = UsageLedger(parent=map_ledger() or self.client.ledger)
        progress = _FunctionMapProgress(total, ledger, enabled=self.rlm.progress and total > 1)
        outcome = MapOutcome(total)
        with progress, _kept_on_interrupt(outcome, "amap"):
            results, errors = await run_interruptibly(
                map_function(
                    fn,
                    listed.values,
                    limiter,
                    cache_dir=self.rlm.cache_dir,
                    resume=resume,
                    settings=dataclasses.asdict(self.client.identity()),
                    observer=progress,
                    outcome=outcome,
                    ledger=ledger,
                )
            )
        return listed.shaped(
            _collect(results, errors, return_exceptions, "amap", outcome.never_sent())
        )

    def namespace(self) -> dict[str, Any]:
        """The helpers by name (with the official library's spellings too), and
        ``amap``, which only the notebook has: model code's functions cannot cross to
        the sandbox's helpers."""
        return {**bound_to(self), "amap": self.amap}


async def amap(
    fn: Callable[[Any], Awaitable[Any]],
    items: Iterable[Any],
    *,
    concurrency: int | None = None,
    return_exceptions: bool = False,
    resume: bool | None = None,
) -> Any:
    """The notebook's ``amap`` (see ``NotebookHelpers.amap``) for code that imports it
    (``from rlm_magic import amap``): bound to the ``RLM`` that ``%load_ext rlm_magic``
    made in this IPython, or to one of default settings where there is none (a script)."""
    return await NotebookHelpers(_session_rlm()).amap(
        fn,
        items,
        concurrency=concurrency,
        return_exceptions=return_exceptions,
        resume=resume,
    )


_default_rlm: RLM | None = None


def _session_rlm() -> RLM:
    """The RLM ``%config RLM...`` configures in this IPython (the extension made it one
    of the shell's configurables), else one of default settings."""
    global _default_rlm
    ipython = sys.modules.get("IPython")
    shell = ipython.get_ipython() if ipython is not None else None
    for configurable in getattr(shell, "configurables", ()):
        if isinstance(configurable, RLM):
            return configurable
    if _default_rlm is None:
        _default_rlm = RLM()
    return _default_rlm


class _FunctionMapProgress(BatchProgress):
    """``amap``'s bar. Its results are the function's values, not model calls: the
    tokens and cost shown are those of the calls its function made, recorded in the
    map's own ``ledger`` (not those another map or cell made meanwhile)."""

    def __init__(self, total: int, ledger: UsageLedger, *, enabled: bool):
        self.ledger = ledger
        super().__init__(total, "amap", enabled=enabled)

    def item_finished(self, index: int, result: Any) -> None:
        super().item_finished(index, None)
        self._count_calls()

    def item_failed(self, index: int, error: BaseException) -> None:
        super().item_failed(index, error)
        self._count_calls()

    def _count_calls(self) -> None:
        now = self.ledger.summary().total
        self.input_tokens, self.output_tokens = now.input_tokens, now.output_tokens
        if now.cost_usd is not None:
            self.cost_usd = now.cost_usd


def _keep_interrupted_answer(stop: KeyboardInterrupt) -> None:
    """An interrupted ``llm_query`` that had received part of its answer: keep it where
    an interrupted batch's answers are, and say so."""
    cut = partial_answer(stop)
    if cut is None:
        return
    unfinished.keep(UnfinishedBatch("llm_query", [cut.text], {}, interrupted=True))
    arrived = cut.text.text if isinstance(cut.text, CutAnswer) else cut.text
    raise interrupt(
        f"llm_query interrupted: the {len(arrived):,} characters of its answer that "
        f"had arrived are in {unfinished.KEPT_IN}.results[0] (a CutAnswer)"
    ) from None


@contextlib.contextmanager
def _kept_on_interrupt(outcome: MapOutcome | BatchOutcome, name: str) -> Iterator[None]:
    """If the batch is interrupted, keep its finished answers (in the whole map's order:
    a resumed map sends only some) and say where they are."""
    try:
        yield
    except KeyboardInterrupt:
        results, errors, on_disk = outcome.answers(), outcome.failures(), outcome.on_disk
        unsent = outcome.never_sent()
        unfinished.keep(UnfinishedBatch(name, results, errors, not_sent=unsent, interrupted=True))
        cut = outcome.cut_by_interrupt
        kept = sum(r is not None for r in results) - cut
        again = (
            "call the function only on the items still without a result"
            if name == "amap"
            else "send only the missing prompts"
        )
        where = (
            f"; they are kept on disk too: run the same cell again to {again}" if on_disk else ""
        )
        parts = (
            f", with the parts of {cut} it cut off (each a CutAnswer: its .text is what "
            "had arrived)"
            if cut
            else ""
        )
        raise interrupt(
            f"{name} interrupted: the {kept} of {len(results)} answers that had arrived "
            f"are in {unfinished.KEPT_IN}.results{parts}{where}"
        ) from None


def _collect(
    results: list[Any],
    errors: dict[int, Exception],
    return_exceptions: bool,
    name: str = "llm_query_batch",
    not_sent: Iterable[int] = (),
) -> list[Any]:
    if not errors:
        return results
    if return_exceptions:
        return [errors.get(i, r) for i, r in enumerate(results)]
    failed = unfinished.keep(UnfinishedBatch(name, results, errors, not_sent=not_sent))
    if len(errors) == len(results) and all(isinstance(e, APIKeyError) for e in errors.values()):
        # No item could be sent for want of a key: that is one line, not N failures.
        raise next(iter(errors.values())) from None
    raise failed


# Code objects of the helpers, to recognise a helper coroutine that was never awaited
# (looked up with whatever an object has as its cr_code, None included).
HELPER_CODES: dict[object, str] = {
    fn.__code__: fn.__name__
    for fn in (
        NotebookHelpers.llm_query,
        NotebookHelpers.llm_query_batch,
        NotebookHelpers.rlm_query,
        NotebookHelpers.rlm_query_batch,
        NotebookHelpers.amap,
        amap,
    )
}
