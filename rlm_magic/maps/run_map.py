"""One map for the notebook and for model code: ``run_map`` asks a model about each of many
conversations, concurrently, and loses no answer.

The notebook's ``llm_query_batch`` and the REPL's run the same code; they differ only in
what they ask (``MapSpec``: the model, budgets, a step's deadline) and in how they report
(a progress bar and exceptions, or a run's status panel and ``"Error: ..."`` strings),
which stays with them (``MapObserver``, and the errors ``run_map`` hands back).

A map:

- asks each conversation under the client's concurrency limit (``gather``), streamed;
- with ``answer_format``, validates every answer, asking again once with the error;
- under a cost budget, holds the most each item can cost, in order, before sending any:
  the items past what fits are not sent, each with the error that says why;
- keeps its answers on disk as they arrive (``resume``: on by default from
  ``RESUME_AT`` prompts), so running the same map again sends only the prompts still
  unanswered; kept typed answers are checked again before they are handed back;
- or, with ``batch_job``, runs as one provider batch job (``jobs``) at the batch price.

What identifies its requests (the response cache's keys, the kept answers' file, the
job's record) is one ``RequestIdentity`` (``LLMClient.identity``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..errors import BudgetExceededError, ConfigError, InvalidAnswer, LLMQueryError
from ..llm.budget import budgets_of
from ..llm.litellm_loader import load_litellm
from ..llm.messages import Messages
from ..llm.structured import AnswerFormat, ask, prepare
from ..llm.usage import UsageLedger
from .gather import BatchOutcome, gather_limited
from .resume import RESUME_AT, MapStore, kept_call

if TYPE_CHECKING:
    from ..llm.client import LLMClient
    from ..llm.identity import RequestIdentity
    from .jobs import BatchJob, JobRecord


@dataclass(frozen=True)
class MapSpec:
    """How a map asks, besides its conversations."""

    model: str | None = None  # None: RLM.sub_model
    max_tokens: int | None = None  # None: RLM.max_tokens
    answer_format: AnswerFormat | None = None  # typed answers
    resume: bool | None = None  # keep answers on disk; None: from RESUME_AT prompts on
    batch_job: bool = False  # one provider batch job instead of a request each
    ledger: UsageLedger | None = None  # where its usage goes; None: the client's
    # When each item must have ended (a REPL step's deadline), read as the item starts.
    deadline: Callable[[], float | None] | None = None


class MapObserver:
    """What a map reports as it goes, by the index of each item in the whole map; every
    method does nothing unless a caller's observer does something with it."""

    def kept(self, count: int) -> None:
        """``count`` items were answered by an earlier run of the same map."""

    def item_started(self, index: int) -> None: ...

    def item_finished(self, index: int, result: Any) -> None:
        """``result``: the item's ``Completion`` (or ``Typed``, for typed answers)."""

    def item_failed(self, index: int, error: BaseException) -> None: ...

    def not_sent(self, count: int, reason: BudgetExceededError) -> None:
        """The last ``count`` items to send did not fit the cost budget: none was sent."""

    def job_changed(self, record: JobRecord) -> None:
        """A batch job's state or counts changed."""


class MapOutcome:
    """Where a map's answers land as they arrive: a caller that keeps it still has every
    finished answer after an interrupt, in the whole map's order."""

    def __init__(self, total: int):
        self.total = total
        self.kept: dict[int, Any] = {}  # index -> value, from an earlier run
        self.sent: list[int] = list(range(total))  # the indices this run asks
        self.gathered = BatchOutcome(total)  # by position in ``sent``
        self.refused: dict[int, Exception] = {}  # index -> why it was not sent (a budget)
        self.on_disk = False  # its answers are kept for a re-run
        self.job: BatchJob | None = None  # the batch job, when it runs as one
        self.answer_format: AnswerFormat | None = None
        # A function's map (``function_map``): its results are the values, not calls.
        self.results_are_values = False

    def answers(self) -> list[Any]:
        """Each item's answer (a value), None where none has arrived. An item an
        interrupt stopped mid-answer has what had arrived, a ``CutAnswer`` (not for typed
        answers: a part of one is no value)."""
        answers: list[Any] = [None] * self.total
        for index, value in self.kept.items():
            answers[index] = value
        partial = self.gathered.partial if self.keeps_partial_answers else {}
        for position, index in enumerate(self.sent):
            result = self.gathered.results[position]
            if result is None and position in partial:
                result = partial[position]
            answers[index] = (
                result if self.results_are_values else _value(result, self.answer_format)
            )
        return answers

    @property
    def keeps_partial_answers(self) -> bool:
        return self.answer_format is None and not self.results_are_values

    @property
    def cut_by_interrupt(self) -> int:
        """Items an interrupt stopped mid-answer, whose part is among ``answers()``."""
        return len(self.gathered.partial) if self.keeps_partial_answers else 0

    def never_sent(self) -> list[int]:
        """The items never sent (their function never called): refused by a budget, or
        not begun when an interrupt came; by index in the whole map."""
        sent = self.sent
        unsent = {sent[p] for p in self.gathered.never_sent() if p < len(sent)}
        return sorted(unsent | set(self.refused))

    def failures(self) -> dict[int, Exception]:
        """The items that failed, by index in the whole map."""
        failed = {self.sent[position]: error for position, error in self.gathered.errors.items()}
        return {**self.refused, **failed}


async def run_map(
    client: LLMClient,
    conversations: Sequence[Messages],
    spec: MapSpec = MapSpec(),
    observer: MapObserver | None = None,
    outcome: MapOutcome | None = None,
) -> tuple[list[Any], dict[int, Exception]]:
    """Ask about every conversation; return ``(answers, errors)``: ``answers[i]`` is item
    i's answer (its text, or its validated value), None where it failed, and ``errors``
    maps the failed items to their exceptions. One failure never stops the others.

    If the map is cancelled (an interrupt), every call under way is cancelled and
    awaited before the cancellation goes on; ``outcome``, if given, then holds what had
    arrived."""
    observer = observer if observer is not None else MapObserver()
    outcome = outcome if outcome is not None else MapOutcome(len(conversations))
    answer_format = outcome.answer_format = spec.answer_format
    identity = client.identity(
        spec.model, spec.max_tokens, answer_format.identity() if answer_format else None
    )
    ledger = spec.ledger if spec.ledger is not None else client.ledger
    if spec.batch_job:
        if budgets_of(ledger):
            raise ConfigError(
                "a batch job's cost is known only when it ends, so it cannot be held to a "
                f"cost budget ({budgets_of(ledger)[0].named()}): unset it, or map without "
                "batch_job"
            )
        return await _as_batch_job(client, conversations, identity, spec, observer, outcome)
    total = len(conversations)
    store = None
    if spec.resume or (spec.resume is None and total >= RESUME_AT):
        store = await MapStore.open(client.config.cache_dir, identity, conversations)
        outcome.kept = await _kept_answers(await store.load_kept(), answer_format, ledger)
        outcome.on_disk = True
    outcome.sent = [i for i in range(total) if i not in outcome.kept]
    observer.kept(len(outcome.kept))
    # Kept answers hold nothing; the rest hold their most, in order, before any is sent.
    holds, refused = await client.reserve_batch(
        [conversations[i] for i in outcome.sent],
        model=identity.model,
        max_tokens=identity.max_tokens,
        ledger=ledger,
    )
    if refused is not None:
        outcome.refused = dict.fromkeys(outcome.sent[len(holds) :], refused)
        outcome.sent = outcome.sent[: len(holds)]
        observer.not_sent(len(outcome.refused), refused)
    outcome.gathered = BatchOutcome(len(outcome.sent))
    redactor = client.redactor()  # one for every item: it scans the environment

    async def ask_one(messages: Messages, hold: Any) -> Any:
        options: dict[str, Any] = {
            "identity": identity,  # (as its answers are kept: not read again per item)
            "ledger": ledger,
            "slot_held": True,
            "redactor": redactor,
            "reservation": hold,
            # Streamed: a slow model's long answer is timed out on a stall, not cut off
            # at a total and started again.
            "stream": True,
            "deadline": spec.deadline() if spec.deadline is not None else None,
        }
        if answer_format is not None:
            return await ask(client.complete, messages, answer_format, identity.model, **options)
        return await client.complete(messages, **options)

    calls = [
        (lambda m=conversations[i], h=hold: ask_one(m, h)) for i, hold in zip(outcome.sent, holds)
    ]
    try:
        await gather_limited(
            calls,
            client.limiter,
            Placed(outcome.sent, observer, store.add if store is not None else None),
            outcome.gathered,
        )
    finally:
        for hold in holds:  # an item interrupted before it started still held its most
            if hold is not None:
                hold.release()
        if store is not None:
            store.close()
    errors = outcome.failures()
    if store is not None and not errors:
        store.remove()  # finished: a re-run is the response cache's business
    return outcome.answers(), errors


async def _as_batch_job(
    client: LLMClient,
    conversations: Sequence[Messages],
    identity: RequestIdentity,
    spec: MapSpec,
    observer: MapObserver,
    outcome: MapOutcome,
) -> tuple[list[Any], dict[int, Exception]]:
    from .jobs import BatchJob  # a job's machinery, loaded by the first job

    if not conversations:
        return [], {}
    answer_format, response_format = spec.answer_format, None
    if answer_format is not None:
        litellm = await load_litellm()
        prepared = [prepare(m, answer_format, litellm, identity.model) for m in conversations]
        conversations = [messages for messages, _ in prepared]
        response_format = prepared[0][1]
    job = outcome.job = BatchJob(
        client,
        conversations,
        identity,
        response_format=response_format,
        observer=observer,
        ledger=spec.ledger,
    )
    results = await job.run()
    answers: list[Any] = list(results.texts)
    errors = results.errors
    if answer_format is not None:
        # A job cannot ask again: an answer that does not validate is its item's error.
        for index, value in enumerate(await answer_format.checked_all(answers)):
            if isinstance(value, InvalidAnswer):
                answers[index] = None
                errors[index] = LLMQueryError(
                    job.model, f"the answer did not match the schema ({value})"
                )
            else:
                answers[index] = value
    return answers, errors


async def _kept_answers(
    kept: dict[int, dict[str, Any]], answer_format: AnswerFormat | None, ledger: UsageLedger
) -> dict[int, Any]:
    """The values of the answers an earlier run kept, by index. A typed one that no longer
    validates (the model class changed, not its schema) is left out: asked again. They
    count as cache hits: they cost nothing this time."""
    kept = {index: entry for index, entry in kept.items() if isinstance(entry.get("text"), str)}
    texts = [entry["text"] for entry in kept.values()]
    checked = texts if answer_format is None else await answer_format.checked_all(texts)
    values: dict[int, Any] = {}
    for (index, entry), value in zip(kept.items(), checked):
        if isinstance(value, InvalidAnswer):
            continue
        values[index] = value
        ledger.record(kept_call(entry, "?"))
    return values


def _value(result: Any, answer_format: AnswerFormat | None) -> Any:
    if result is None:
        return None
    return result.value if answer_format is not None else result.text


class Placed:
    """Between ``gather_limited`` (which numbers only the items it sends) and the map's
    observer: each item under its index in the whole map, its answer kept on disk
    (``keep``: a ``MapStore``'s ``add``, or ``add_value`` for a function's map)."""

    def __init__(
        self,
        indices: list[int],
        observer: MapObserver,
        keep: Callable[[int, Any], None] | None,
    ):
        self.indices, self.observer, self.keep = indices, observer, keep

    def item_started(self, position: int) -> None:
        self.observer.item_started(self.indices[position])

    def item_finished(self, position: int, result: Any) -> None:
        if self.keep is not None:
            self.keep(self.indices[position], result)
        self.observer.item_finished(self.indices[position], result)

    def item_failed(self, position: int, error: BaseException) -> None:
        self.observer.item_failed(self.indices[position], error)
