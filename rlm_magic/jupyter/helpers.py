"""The awaitable helpers put into the notebook: ``llm_query``, ``llm_query_batch``,
``rlm_query``, ``rlm_query_batch`` (and the ``_batched`` aliases).

They are coroutine functions bound to one ``RLM`` (its settings, client and ledger), so
``await llm_query_batch(prompts)`` in a cell runs every prompt concurrently on the
kernel's own loop.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any, cast

from ..errors import BatchError, ConfigError, interrupt
from ..llm.limiter import ConcurrencyLimiter
from ..llm.messages import as_prompt_list, build_messages, check_max_tokens
from ..llm.structured import AnswerFormat, ask
from ..maps.gather import BatchOutcome, gather_limited
from ..maps.run_map import MapOutcome, MapSpec, run_map
from ..repl.helpers import bound_to
from .interrupts import run_interruptibly
from .progress import BatchProgress

if TYPE_CHECKING:
    from ..rlm.runner import RLM


class NotebookHelpers:
    """The helpers as a user sees them in the notebook, bound to one ``RLM``."""

    def __init__(self, rlm: RLM):
        self.rlm = rlm

    @property
    def client(self):
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
                    stream=True,
                ),
                "llm_query",
            )
            return typed.value
        completion = await run_interruptibly(
            # Streamed (RLM.stream): a slow answer is timed out on a stall, not its length.
            self.client.complete(messages, model=model, max_tokens=max_tokens, stream=True),
            "llm_query",
        )
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
    ) -> list:
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
        """
        prompts = as_prompt_list(prompts, "llm_query_batch")
        check_max_tokens(max_tokens, "llm_query_batch")
        conversations = [build_messages(p, system, caller="llm_query_batch") for p in prompts]
        spec = MapSpec(
            model=model,
            max_tokens=max_tokens,
            answer_format=AnswerFormat(response_format) if response_format is not None else None,
            resume=resume,
            batch_job=batch_job,
        )
        if batch_job:
            if not conversations:
                return []
            return await self._batch_job(conversations, spec, return_exceptions)
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
        return _collect(answers, errors, return_exceptions)

    async def _batch_job(self, conversations: list, spec: MapSpec, return_exceptions: bool) -> list:
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
    ) -> list:
        """Run one child RLM per prompt, concurrently; answers in the prompts' order."""
        prompts = as_prompt_list(prompts, "rlm_query_batch")
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
        return _collect(results, errors, return_exceptions)

    def namespace(self) -> dict[str, Any]:
        """The helpers by name (with the official library's spellings too)."""
        return bound_to(self)


_interrupted_batch: BatchError | None = None


def interrupted_batch() -> BatchError | None:
    """The answers of the last batch that was interrupted (``.results``, with None
    where an item had not finished, and ``.errors``), or None."""
    return _interrupted_batch


@contextlib.contextmanager
def _kept_on_interrupt(outcome: MapOutcome | BatchOutcome, name: str) -> Iterator[None]:
    """If the batch is interrupted, keep its finished answers (in the whole map's order:
    a resumed map sends only some) and say where they are."""
    global _interrupted_batch
    try:
        yield
    except KeyboardInterrupt:
        results, errors, on_disk = outcome.answers(), outcome.failures(), outcome.on_disk
        _interrupted_batch = BatchError(results, errors)
        kept = sum(r is not None for r in results)
        where = (
            "; they are kept on disk too: run the same cell again to send only the missing prompts"
            if on_disk
            else ""
        )
        raise interrupt(
            f"{name} interrupted: the {kept} of {len(results)} answers that had arrived "
            f"are in rlm_magic.interrupted_batch().results{where}"
        ) from None


def _collect(results: list, errors: dict[int, Exception], return_exceptions: bool) -> list:
    if not errors:
        return results
    if return_exceptions:
        return [errors.get(i, r) for i, r in enumerate(results)]
    raise BatchError(results, errors)


# Code objects of the helpers, to recognise a helper coroutine that was never awaited
# (looked up with whatever an object has as its cr_code, None included).
HELPER_CODES: dict[object, str] = {
    fn.__code__: fn.__name__
    for fn in (
        NotebookHelpers.llm_query,
        NotebookHelpers.llm_query_batch,
        NotebookHelpers.rlm_query,
        NotebookHelpers.rlm_query_batch,
    )
}
