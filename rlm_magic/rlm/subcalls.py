"""The sub-call service: what the REPL's helpers (``llm_query``, ``llm_query_batch``,
``rlm_query``, ``rlm_query_batch``) do when model code calls them.

Model code may not choose its model (the sub-model is pinned), may not spend past the
run's sub-call and cost budgets (a call the cost budget has no room for is not sent,
and a batch is cut to what fits before any item goes), sees failures as
``"Error: ..."`` strings, never as exceptions, and gets answers and errors redacted (an
endpoint may echo a key in either, in any form ``llm.redaction`` knows). A model
code's map is the notebook's (``maps.run_map``), reporting its way.
The budgets and counts a run shares with its children are its ``tree.RunTree``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterator
from typing import TYPE_CHECKING, Any, cast

from ..errors import ConfigError, LLMQueryError, PromptTooLongError, describe_exception
from ..llm.completion import CutAnswer
from ..llm.limiter import ConcurrencyLimiter
from ..llm.messages import build_messages
from ..llm.redaction import Redactor, off_loop_if_large
from ..llm.structured import AnswerFormat, ask
from ..llm.windows import is_context_error, prompt_in_error
from ..maps.gather import gather_limited
from ..maps.run_map import MapObserver, MapSpec, run_map
from ..repl.helpers import bound_to

if TYPE_CHECKING:
    from .result import RLMResult
    from .scope import RunScope

# Runs a child RLM: (prompt, context) -> its result.
ChildRun = Callable[[str, Any], Awaitable["RLMResult"]]


class SubCalls:
    """The helpers of one run, as model code sees them: pinned model, errors as values.
    ``child_run`` runs a child RLM for ``rlm_query`` (in the run's scope's tree)."""

    def __init__(self, scope: RunScope, child_run: ChildRun):
        self.scope = scope
        self.client, self.tree = scope.client, scope.tree
        settings = scope.settings
        self.sub_model, self.max_tokens = settings.sub_model, settings.max_tokens
        self.depth, self.max_depth = scope.depth, settings.max_depth
        self.child_run = child_run
        self.own = 0  # sub-calls this run made (its children's are theirs)
        self.cut_answers = 0  # sub-call answers that stopped at max_tokens

    @property
    def deadline(self) -> float | None:
        """``time.monotonic()`` by which calls must end: a child run inherits its
        parent's step deadline; each step of its own sets a nearer one."""
        return self.scope.calls_end_by

    def helpers(self) -> dict[str, Any]:
        """The REPL's helpers by name (with the official library's spellings too)."""
        return bound_to(self)

    async def llm_query(
        self,
        prompt: Any,
        model: str | None = None,
        *,
        system: str | None = None,
        max_tokens: int | None = None,
        response_format: Any = None,
        **_ignored: Any,
    ) -> Any:
        """Ask the sub-model one question; a failure comes back as 'Error: ...'. With
        ``response_format`` (a JSON schema), the answer is a validated dict."""
        del model  # pinned: generated code may not switch to another model
        answer_format = await _answer_format(response_format)
        if isinstance(answer_format, str):
            return answer_format
        if not self._take_sub_calls(1):
            return self._limit_error()
        return await self._sub_call(prompt, system, max_tokens, answer_format=answer_format)

    async def llm_query_batch(
        self,
        prompts: Any,
        model: str | None = None,
        *,
        system: str | None = None,
        max_tokens: int | None = None,
        response_format: Any = None,
        resume: Any = None,
        **_ignored: Any,
    ) -> list[Any]:
        """Ask many questions concurrently; failures come back as 'Error: ...' in place.
        With ``response_format`` (a JSON schema), each answer is a validated dict. The
        map is the notebook's (``maps.run_map``), within the run's budgets: ``resume``
        keeps its answers on disk (by default from 100 prompts on).

        Not ``batch_job`` (ignored, as any other option is): a provider's job runs for
        minutes to hours, past any step's time, and what it costs is known only when it
        ends, so it could not be held to the run's budget."""
        del model
        if isinstance(prompts, str):
            prompts = [prompts]
        prompts = list(prompts)
        answer_format = await _answer_format(response_format)
        if isinstance(answer_format, str):
            return [answer_format] * len(prompts)
        allowed = self._take_sub_calls(len(prompts))
        tokens = self._tokens(max_tokens)
        system = system if isinstance(system, str) else None
        conversations = [
            build_messages(p if isinstance(p, str) else str(p), system) for p in prompts[:allowed]
        ]
        spec = MapSpec(
            model=self.sub_model,
            max_tokens=tokens,
            answer_format=answer_format,
            resume=resume if isinstance(resume, bool) else None,
            ledger=self.tree.ledger,
            deadline=lambda: self.deadline,
        )
        answers, errors = await run_map(self.client, conversations, spec, _TreeObserver(self))
        answers = await redacted(answers, self.client.redactor())
        answers = [
            self._error_value(errors[i], tokens) if i in errors else answer
            for i, answer in enumerate(answers)
        ]
        return answers + [self._limit_error()] * (len(prompts) - allowed)

    async def rlm_query(
        self, prompt: Any, context: Any = None, model: str | None = None, **_ignored: Any
    ) -> str:
        """Solve a sub-problem with a child RLM (or llm_query at the depth limit)."""
        del model
        prompt = prompt if isinstance(prompt, str) else str(prompt)
        if self.depth >= self.max_depth:
            if context is not None:
                prompt = f"{prompt}\n\nContext:\n{context}"
            answer: str = await self.llm_query(prompt)  # (a str without response_format)
            return answer
        if not self._take_sub_calls(1):
            return self._limit_error()
        self.tree.call_started()
        outcome = await self.child_run(prompt, context)
        self.tree.call_ended(failed=not outcome.success)
        if outcome.success:
            answer = cast(str, outcome.final_answer)  # a successful run has one
        else:
            answer = f"Error: child RLM failed: {outcome.error}"
        return await off_loop_if_large(len(answer), self.client.redactor(), answer)

    async def rlm_query_batch(
        self, prompts: Any, contexts: Any = None, model: str | None = None, **_ignored: Any
    ) -> list[str]:
        """Run child RLMs concurrently; answers in order, failures as 'Error: ...'."""
        del model
        prompts = [prompts] if isinstance(prompts, str) else list(prompts)
        contexts = [None] * len(prompts) if contexts is None else list(contexts)
        if len(contexts) != len(prompts):
            return [
                f"Error: rlm_query_batch got {len(prompts)} prompts and {len(contexts)} contexts"
            ] * len(prompts)
        # Children hold no client slot while they think: a limiter of their own.
        limiter = ConcurrencyLimiter(self.scope.max_concurrency)
        calls = [(lambda p=p, c=c: self.rlm_query(p, c)) for p, c in zip(prompts, contexts)]
        answers, errors = await gather_limited(calls, limiter)
        redact = self.client.redactor()
        return [redact(f"Error: {errors[i]}") if i in errors else a for i, a in enumerate(answers)]

    async def _sub_call(
        self,
        prompt: Any,
        system: str | None,
        max_tokens: int | None,
        answer_format: AnswerFormat | None = None,
    ) -> Any:
        """One ``llm_query``: the run's budgets, the sub-model, errors as values."""
        prompt = prompt if isinstance(prompt, str) else str(prompt)
        tokens = self._tokens(max_tokens)
        self.tree.call_started()
        messages = build_messages(prompt, system if isinstance(system, str) else None)
        options: dict[str, Any] = {
            "model": self.sub_model,
            "max_tokens": tokens,
            "ledger": self.tree.ledger,
            # Streamed: the timeout is then a stall timeout, and a slow local model's
            # long answer is not cut off at a total and started again.
            "stream": True,
            "deadline": self.deadline,
        }
        try:
            if answer_format is not None:
                typed = await ask(
                    self.client.complete, messages, answer_format, self.sub_model, **options
                )
                completion = typed.completion
            else:
                completion = await self.client.complete(messages, **options)
        except Exception as exc:  # noqa: BLE001 - errors are values inside the REPL
            self.tree.call_ended(failed=True)
            return self._error_value(exc, tokens)
        self.tree.call_ended()
        if completion.incomplete:  # at max_tokens, or broken off (a stall, a deadline)
            self.cut_answers += 1
        answer = typed.value if answer_format is not None else completion.text
        return await redacted(answer, self.client.redactor())

    def _tokens(self, max_tokens: Any) -> int:
        """The max_tokens model code asked for, at most the run's."""
        if isinstance(max_tokens, int) and max_tokens > 0:
            return min(max_tokens, self.max_tokens)
        return self.max_tokens

    def _error_value(self, exc: BaseException, max_tokens: int) -> str:
        """A failed sub-call as model code sees it: one line, with what to change, and
        nothing of a secret (whatever raised it: a typed answer's check quotes it)."""
        return self.client.redactor()(self._error_line(exc, max_tokens))

    def _error_line(self, exc: BaseException, max_tokens: int) -> str:
        if isinstance(exc, PromptTooLongError):
            return "Error: " + exc.reason.replace("the model takes", "the sub-model takes")
        if is_context_error(exc):
            return "Error: " + refusal_advice(
                exc, self.client.input_window(self.sub_model), max_tokens
            )
        if isinstance(exc, LLMQueryError):
            return f"Error: {exc}"
        return f"Error: {describe_exception(exc)}"

    def _take_sub_calls(self, wanted: int) -> int:
        allowed = self.tree.take_sub_calls(wanted)
        self.own += allowed
        return allowed

    def _limit_error(self) -> str:
        return (
            f"Error: max_sub_calls={self.tree.max_sub_calls} reached for this run; "
            "no request was sent"
        )


async def redacted(answer: Any, redact: Redactor) -> Any:
    """A sub-call's answer (its text, a typed value, a map's list of them) as model code
    gets it: a proxy or a server that quotes the request may echo a key in an answer as
    well as in an error. Its strings, keys included, are redacted in one pass (off the
    loop when they are large); a cut answer stays a ``CutAnswer``."""
    if isinstance(answer, str):
        return await off_loop_if_large(len(answer), _redacted, answer, redact)
    if isinstance(answer, list) and all(isinstance(item, str) for item in answer):
        size = sum(map(len, answer))  # (a batch's texts: quick to size)
        return await off_loop_if_large(size, _redacted, answer, redact)
    # A typed value may hold 200,000 JSON values: walking it alone takes a while.
    return await asyncio.to_thread(_redacted, answer, redact)


def _redacted(answer: Any, redact: Redactor) -> Any:
    strings: list[str] = []
    _strings_in(answer, strings)
    clean = redact.each(strings)
    if clean is strings:  # (nothing found: the common case)
        return answer
    return _rebuilt(answer, iter(clean))


def _strings_in(value: Any, found: list[str]) -> None:
    if isinstance(value, CutAnswer):
        found.append(value.text)
    elif isinstance(value, str):
        found.append(value)
    elif isinstance(value, dict):
        for key, item in value.items():
            _strings_in(key, found)
            _strings_in(item, found)
    elif isinstance(value, list):
        for item in value:
            _strings_in(item, found)


def _rebuilt(value: Any, clean: Iterator[str]) -> Any:
    """``value`` with its strings, in ``_strings_in``'s order, taken from ``clean``."""
    if isinstance(value, CutAnswer):
        text = next(clean)
        if text == value.text:
            return value
        return CutAnswer(text, value.reason, broken_off=value.broken_off)
    if isinstance(value, str):
        return next(clean)
    if isinstance(value, dict):
        return {_rebuilt(key, clean): _rebuilt(item, clean) for key, item in value.items()}
    if isinstance(value, list):
        return [_rebuilt(item, clean) for item in value]
    return value


def refusal_advice(exc: BaseException, window: int | None, max_tokens: int) -> str:
    """What to cut when the provider refused a prompt as too long, with numbers."""
    takes = f" of {window:,} tokens" if window else ""
    counted = prompt_in_error(exc)
    if counted and window and counted < window:
        # The prompt fits; the prompt and max_tokens together did not.
        return (
            f"the provider counts the prompt at {counted:,} tokens and max_tokens="
            f"{max_tokens:,} does not fit beside it in the sub-model's window{takes}: "
            f"ask with max_tokens <= {window - counted:,}, or cut the prompt"
        )
    size = f", counting {counted:,} tokens" if counted else ""
    return (
        f"the prompt is over the sub-model's window{takes} (the provider refused "
        f"it{size}); split it"
    )


async def _answer_format(response_format: Any) -> AnswerFormat | str | None:
    """The format model code asked for (a JSON schema: what can cross from the
    sandbox), or the 'Error: ...' it gets for a bad one."""
    if response_format is None:
        return None
    try:
        return await AnswerFormat.from_model_code(response_format)
    except ConfigError as exc:
        return f"Error: {exc}"


class _TreeObserver(MapObserver):
    """Counts a REPL map's items into the run's status (for the status panel), and the
    answers cut off (for the model's feedback)."""

    def __init__(self, calls: SubCalls):
        self.calls = calls

    def item_started(self, index: int) -> None:
        self.calls.tree.call_started()

    def item_finished(self, index: int, result: Any) -> None:
        self.calls.tree.call_ended()
        if result.incomplete:  # at max_tokens, or broken off (a stall, a deadline)
            self.calls.cut_answers += 1

    def item_failed(self, index: int, error: BaseException) -> None:
        self.calls.tree.call_ended(failed=True)
