"""The awaitable helpers put into the notebook: ``llm_query``, ``llm_query_batch``,
``rlm_query``, ``rlm_query_batch`` (and the ``_batched`` aliases).

They are coroutine functions bound to one ``RLM`` (its settings, client and ledger), so
``await llm_query_batch(prompts)`` in a cell runs every prompt concurrently on the
kernel's own loop.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from ..errors import BatchError, ConfigError, LLMQueryError, interrupt
from ..llm.messages import as_prompt_list, build_messages, check_max_tokens
from ..llm.structured import AnswerFormat, InvalidAnswer, ask, prepare
from ..llm.usage import CallRecord
from ..maps.gather import BatchOutcome, gather_limited
from ..maps.resume import RESUME_AT, KeepingObserver, MapStore
from .interrupts import run_interruptibly
from .progress import BatchProgress

if TYPE_CHECKING:
    from ..rlm.engine import RLM


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
        answer_format = AnswerFormat(response_format) if response_format is not None else None
        if batch_job:
            return await self._batch_job(
                conversations, model, max_tokens, return_exceptions, answer_format
            )
        client = self.client
        redactor = client.redactor()
        model_name = model or self.rlm.effective_sub_model

        def call(messages):
            if answer_format is not None:
                return lambda: ask(
                    client.complete,
                    messages,
                    answer_format,
                    model_name,
                    model=model,
                    max_tokens=max_tokens,
                    slot_held=True,
                    redactor=redactor,
                    stream=True,
                )
            # Streamed: a slow model's long answer is timed out on a stall, not cut
            # off at a total and started again.
            return lambda: client.complete(
                messages,
                model=model,
                max_tokens=max_tokens,
                slot_held=True,
                redactor=redactor,
                stream=True,
            )

        def answer(completion):
            if completion is None:
                return None
            return completion.value if answer_format is not None else completion.text

        total = len(prompts)
        store, kept = None, {}
        if resume or (resume is None and total >= RESUME_AT):
            # What the requests are sent with (the max_tokens sent, where they go, a
            # Router's setup), so answers made under other settings are never handed back.
            store = await MapStore.open(
                self.rlm.cache_dir,
                conversations,
                {
                    "model": model or self.rlm.effective_sub_model,
                    "api_base": client.endpoint.identity,
                    "max_tokens": max_tokens or self.rlm.max_tokens,
                    "options": self.rlm.litellm_kwargs,
                    "format": answer_format.identity() if answer_format else None,
                },
            )
            kept = await store.load_kept()
            if answer_format is not None:
                kept = _still_valid(kept, answer_format)
            _count_kept(client.ledger, kept)
        missing = [i for i in range(total) if i not in kept]
        progress = BatchProgress(
            total,
            "llm_query_batch",
            enabled=self.rlm.progress and total > 1,
            hold=client.gate(model).hold_message,
        )
        progress.done = len(kept)
        observer = KeepingObserver(store, missing, progress) if store else progress
        outcome = BatchOutcome(len(missing))

        def merged(values: list) -> list:
            answers = [None] * total
            for index, entry in kept.items():
                answers[index] = entry.get("value", entry["text"])
            for position, index in enumerate(missing):
                answers[index] = values[position]
            return answers

        def place(values: list, errors: dict) -> tuple[list, dict]:
            return merged(values), {missing[p]: error for p, error in errors.items()}

        try:
            with (
                progress,
                _kept_on_interrupt(
                    outcome, "llm_query_batch", answer, place, on_disk=store is not None
                ),
            ):
                completions, errors = await run_interruptibly(
                    gather_limited(
                        [call(conversations[i]) for i in missing], client.limiter, observer, outcome
                    )
                )
        finally:
            if store is not None:
                store.close()
        answers, errors = place([answer(c) for c in completions], errors)
        if store is not None and not errors:
            store.remove()  # finished: a re-run is the response cache's business
        return _collect(answers, errors, return_exceptions)

    async def _batch_job(
        self, conversations, model, max_tokens, return_exceptions, answer_format=None
    ) -> list:
        from ..llm.litellm_loader import load_litellm
        from ..maps.jobs import BatchJob
        from .job_progress import JobProgress, still_running

        if not conversations:
            return []
        params = {"max_tokens": max_tokens} if max_tokens else {}
        if answer_format is not None:
            litellm = await load_litellm()
            name = model or self.rlm.effective_sub_model
            prepared = [prepare(m, answer_format, litellm, name) for m in conversations]
            conversations = [messages for messages, _ in prepared]
            params["response_format"] = prepared[0][1]
        progress = JobProgress(len(conversations), "llm_query_batch", enabled=self.rlm.progress)
        job = BatchJob(self.client, conversations, model=model, params=params, observer=progress)
        try:
            with progress:
                results = await run_interruptibly(job.run(), "llm_query_batch")
        except KeyboardInterrupt:
            if job.record is None or job.record.ended:
                raise
            raise interrupt(still_running(job.record)) from None
        answers, errors = results.texts, results.errors
        if answer_format is not None:
            # A job cannot ask again: an answer that does not validate is its item's error.
            answers = list(answers)
            for index, text in enumerate(answers):
                if text is not None:
                    try:
                        answers[index] = answer_format.parse(text)
                    except InvalidAnswer as problem:
                        answers[index] = None
                        errors[index] = LLMQueryError(
                            job.model, f"the answer did not match the schema ({problem})"
                        )
        return _collect(answers, errors, return_exceptions)

    async def rlm_query(self, prompt: str, context: Any = None) -> str:
        """Run a child RLM on ``context`` and return its final answer (a str)."""
        result = await run_interruptibly(self.rlm.arun(prompt, context=context), "rlm_query")
        if not result.success:
            raise result.as_exception()
        return result.final_answer

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
        from ..llm.limiter import ConcurrencyLimiter

        # Child runs hold no client slot while they think (their own calls take slots),
        # so they get a limiter of their own: sharing one could deadlock.
        limiter = ConcurrencyLimiter(lambda: self.rlm.max_concurrency)
        calls = [(lambda p=p, c=c: self.rlm_query(p, c)) for p, c in zip(prompts, contexts)]
        progress = BatchProgress(
            len(prompts), "rlm_query_batch", enabled=self.rlm.progress and len(prompts) > 1
        )
        outcome = BatchOutcome(len(prompts))
        with progress, _kept_on_interrupt(outcome, "rlm_query_batch", lambda r: r):
            results, errors = await run_interruptibly(
                gather_limited(calls, limiter, progress, outcome)
            )
        return _collect(results, errors, return_exceptions)

    def namespace(self) -> dict[str, Any]:
        return {
            "llm_query": self.llm_query,
            "llm_query_batch": self.llm_query_batch,
            "llm_query_batched": self.llm_query_batch,
            "rlm_query": self.rlm_query,
            "rlm_query_batch": self.rlm_query_batch,
            "rlm_query_batched": self.rlm_query_batch,
        }


def _text(completion) -> str | None:
    return completion.text if completion is not None else None


_interrupted_batch: BatchError | None = None


def interrupted_batch() -> BatchError | None:
    """The answers of the last batch that was interrupted (``.results``, with None
    where an item had not finished, and ``.errors``), or None."""
    return _interrupted_batch


@contextlib.contextmanager
def _kept_on_interrupt(outcome: BatchOutcome, name: str, value, place=None, on_disk: bool = False):
    """If the batch is interrupted, keep its finished answers and say where they are.
    ``place`` puts the answers and errors of the prompts sent in their places in the
    whole map (a resumed map sends only some)."""
    global _interrupted_batch
    try:
        yield
    except KeyboardInterrupt:
        results = [value(r) for r in outcome.results]
        errors = outcome.errors or {}
        if place is not None:
            results, errors = place(results, errors)
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


def _still_valid(kept: dict[int, dict], answer_format: AnswerFormat) -> dict[int, dict]:
    """Kept typed answers parsed before anything is sent (``value``); one that no longer
    validates (the model class changed, not its schema) is left out: asked again."""
    valid = {}
    for index, entry in kept.items():
        try:
            valid[index] = {**entry, "value": answer_format.parse(entry["text"])}
        except InvalidAnswer:
            continue
    return valid


def _count_kept(ledger, kept: dict[int, dict]) -> None:
    """Answers an earlier run kept count as cache hits: they cost nothing this time."""
    for entry in kept.values():
        ledger.record(
            CallRecord(
                entry.get("model", "?"),
                int(entry.get("input_tokens", 0)),
                int(entry.get("output_tokens", 0)),
                0.0,
                cached=True,
            )
        )


def _collect(results: list, errors: dict[int, Exception], return_exceptions: bool) -> list:
    if not errors:
        return results
    if return_exceptions:
        return [errors.get(i, r) for i, r in enumerate(results)]
    raise BatchError(results, errors)


# Code objects of the helpers, to recognise a helper coroutine that was never awaited.
HELPER_CODES = {
    fn.__code__: fn.__name__
    for fn in (
        NotebookHelpers.llm_query,
        NotebookHelpers.llm_query_batch,
        NotebookHelpers.rlm_query,
        NotebookHelpers.rlm_query_batch,
    )
}
