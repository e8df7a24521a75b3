"""The RLM loop: a root model answers a question by writing code in a REPL where the
context is a variable, calling sub-models on pieces of it, until it gives its answer.

One turn of the loop: the root model is asked (``_root_turn``: the conversation is
compacted first if it nears the model's window; the answer streams in, and with early
execution its finished blocks start running while it still writes); its reply's blocks
run in the REPL (``_run_block``: within a step's time, output redacted and cut to what
the model may read); and the run ends when an answer is taken (``finishing``), the
budget is spent, or the turns run out (one last turn then asks for the answer).

A ``Run`` holds one run's state, so several runs of one ``RLM`` (and a run's child runs,
for ``rlm_query``) go on at once. Where the REPL lives is ``workspace``'s business, what
the model is told ``prompts``', and what the REPL's helpers do ``subcalls``'.
"""

from __future__ import annotations

import asyncio
import itertools
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..errors import ConfigError, LLMQueryError, PromptTooLongError, describe_exception
from ..llm.redaction import off_loop_if_large, redact_messages
from ..llm.usage import UsageLedger
from ..llm.windows import is_context_error
from ..repl.base import REPL, SandboxSettings
from .compaction import Conversation
from .finishing import Finishing, is_error
from .live_turn import LiveTurn
from .prompts import CONTINUE_PROMPT, ITERATION_LIMIT_PROMPT, RunPrompts
from .replies import ACCEPTED_FORMS, read_final_call
from .result import CodeRun, Iteration, RLMResult
from .session import RLMSession
from .subcalls import RunTree, SubCalls
from .workspace import Workspace

if TYPE_CHECKING:
    from ..config import RLMConfig
    from ..llm.client import LLMClient

_run_ids = itertools.count(1)


@dataclass(frozen=True)
class RunSettings:
    """A run's settings, read once when it starts: a ``%config`` during the run cannot
    change it halfway."""

    model: str
    sub_model: str
    max_iterations: int
    max_depth: int
    step_timeout: float
    max_output_chars: int
    max_tokens: int
    sandbox: str  # "process" or "none"
    early_execution: bool
    compact_at: float


class Run:
    """One RLM run (root or child): its REPL, conversation and result. ``config``: the
    ``RLM`` it runs for (its settings are read once, here); ``client``: the client all of
    its calls go through."""

    def __init__(
        self,
        config: RLMConfig,
        client: LLMClient,
        query: str,
        context: Any = None,
        *,
        model: str | None = None,
        sub_model: str | None = None,
        max_iterations: int | None = None,
        max_depth: int | None = None,
        namespace: dict[str, Any] | None = None,
        sandbox: str | None = None,
        depth: int = 0,
        tree: RunTree | None = None,
        deadline: float | None = None,
        session: RLMSession | None = None,
    ):
        self.config, self.client = config, client
        if session is not None and namespace is not None:
            raise ConfigError(
                "a session keeps a REPL of its own: it cannot run in the "
                "notebook's namespace (--live)"
            )
        self.session = session
        self.id = next(_run_ids)
        self.query = query
        self.context = context
        self.depth = depth
        self.namespace = namespace
        self.settings = settings = RunSettings(
            model=model or config.model,
            sub_model=sub_model or config.effective_sub_model,
            max_iterations=max_iterations if max_iterations is not None else config.max_iterations,
            max_depth=max_depth if max_depth is not None else config.max_depth,
            step_timeout=config.step_timeout,
            max_output_chars=config.max_output_chars,
            max_tokens=config.max_tokens,
            sandbox=_where_code_runs(sandbox, config.sandbox, namespace, session),
            early_execution=config.early_execution and config.stream,
            compact_at=config.compact_at,
        )
        self.tree = tree or RunTree(
            UsageLedger(parent=client.ledger), config.max_sub_calls, config.max_cost_usd
        )
        # What the REPL's helpers call: pinned sub-model, budgets, errors as values.
        self.calls = SubCalls(
            client,
            lambda: config.max_concurrency,
            self.tree,
            sub_model=settings.sub_model,
            depth=depth,
            max_depth=settings.max_depth,
            max_tokens=settings.max_tokens,
            child_run=self._child_run,
            deadline=deadline,
        )
        self.result = RLMResult(
            query=query,
            model=settings.model,
            sub_model=settings.sub_model,
            depth=depth,
            sandbox=settings.sandbox,
        )
        self.finishing = Finishing(self.result)
        self.prompts = RunPrompts(
            client,
            template=config.system_prompt,
            sub_model=settings.sub_model,
            max_tokens=settings.max_tokens,
            max_depth=settings.max_depth,
            depth=depth,
            max_output_chars=settings.max_output_chars,
        )
        # The root conversation, compacted to fit the model's window.
        self.conversation = Conversation(
            client,
            model=settings.model,
            max_tokens=settings.max_tokens,
            compact_at=settings.compact_at,
            ledger=self.tree.ledger,
            deadline=deadline,
            share_history=self._share_history,
            status=self._status,
            compactions=self.result.compactions,
        )
        self.workspace: Workspace | None = None

    # What the status panel and the %%rlm cell read.
    @property
    def model(self) -> str:
        return self.settings.model

    @property
    def max_iterations(self) -> int:
        return self.settings.max_iterations

    @property
    def repl(self) -> REPL | None:
        """The run's REPL, once it is open."""
        return self.workspace.repl if self.workspace is not None else None

    # -- the run ---------------------------------------------------------------------------
    async def execute(self) -> RLMResult:
        if self.session is None:
            return await self._execute()
        async with self.session.answering(self.result):
            return await self._execute()

    async def _execute(self) -> RLMResult:
        started = time.perf_counter()
        result = self.result
        try:
            self.workspace = workspace = Workspace(
                self.context,
                self.calls.helpers(),
                sandbox=self.settings.sandbox,
                settings=SandboxSettings.from_config(self.config),
                secrets=tuple(self.config.configured_secrets()),
                max_output_chars=self.settings.max_output_chars,
                sub_calls_left=self.tree.sub_calls_left,
                namespace=self.namespace,
                session=self.session,
            )
            self.finishing.repl = await workspace.open()
            self.context = workspace.context  # a session's latest, when none was given
            await self._loop(result)
        except asyncio.CancelledError:
            result.stop_reason, result.error = "interrupted", "interrupted by the user"
            raise
        except Exception as exc:  # noqa: BLE001 - the run fails, the result keeps it
            result.stop_reason, result.error = "error", describe_exception(exc)
        finally:
            if self.workspace is not None:
                await self.workspace.close(result)
            if result.stop_reason == "final" and is_error(result.final_answer):
                # The answer is a failed call's error string: that is not an answer.
                result.stop_reason = "error"
                result.error = (
                    "the final answer is an error message, not an answer: "
                    + (" ".join(str(result.final_answer).split())[:300])
                )
            result.success = result.stop_reason == "final"
            result.iterations = len(result.trajectory)
            result.usage = self.tree.ledger.summary()
            result.elapsed_s = time.perf_counter() - started
        return result

    async def _loop(self, result: RLMResult) -> None:
        settings = self.settings
        # litellm's model info gives the windows the prompt advises by.
        await self.client.look_up_windows(settings.model, settings.sub_model)
        self.conversation.start(
            self.prompts.system(self.context),
            self.prompts.first_message(self.query, self.session),
        )
        for index in range(1, settings.max_iterations + 1):
            self._status("thinking", iteration=index)
            turn_started = time.perf_counter()
            calls_before = self.calls.own
            iteration = Iteration(index=index, response="")
            outputs: list[str] = []

            def new_turn(
                iteration: Iteration = iteration, outputs: list[str] = outputs
            ) -> LiveTurn:
                return LiveTurn(
                    (lambda n, code: self._run_block(n, code, iteration, outputs))
                    if settings.early_execution
                    else None
                )

            reply, turn = await self._root_turn(index, iteration, new_turn)
            iteration.response = reply
            result.trajectory.append(iteration)
            feedback, final = await self._act_on(reply, iteration, turn, outputs)
            if iteration.broken_off:
                ran = " after its code had run" if iteration.early_blocks else ""
                feedback = (
                    f"(Your reply was cut off{ran}: {iteration.broken_off}. Its "
                    f"output is below.)\n\n{feedback}"
                )
            iteration.sub_calls = self.calls.own - calls_before
            iteration.elapsed_s = time.perf_counter() - turn_started
            if final is not None:
                result.final_answer, result.finished_by = final
                iteration.finished_by, result.stop_reason = result.finished_by, "final"
                return
            if self._stopped_by_budget(result):
                return
            self.conversation.add(reply, feedback)
        await self._last_turn(result)

    async def _last_turn(self, result: RLMResult) -> None:
        """Out of iterations: one last chance to answer, without running code."""
        limit = self.settings.max_iterations
        self._status("thinking", iteration=limit)
        reply, _ = await self._root_turn(
            limit + 1, None, LiveTurn, extra=[{"role": "user", "content": ITERATION_LIMIT_PROMPT}]
        )
        reading = self.finishing.read(reply)
        # Code is not run now; a block that only calls FINAL (as the prompt teaches)
        # is read as the answer it gives.
        marker = self.finishing.readable(reading)[0] or next(
            filter(None, map(read_final_call, reading.blocks)), None
        )
        answer = (await self.finishing.resolve(marker))[0] if marker else None
        if answer is not None:
            result.final_answer, result.stop_reason = answer, "final"
            result.finished_by = "text marker"
        else:
            result.final_answer = reply.strip() or None
            result.stop_reason = "max_iterations"
            result.error = (
                f"no FINAL answer within max_iterations={limit}; "
                "final_answer holds the model's last reply"
            )

    # -- a root turn, on a conversation that fits the root model's window ---------------
    async def _root_turn(
        self,
        index: int,
        iteration: Iteration | None,
        new_turn: Callable[[], LiveTurn],
        extra: Sequence[dict[str, Any]] = (),
    ) -> tuple[str, LiveTurn]:
        """A root turn on the conversation, compacted first when it nears the model's
        window; a context-length error compacts it once more and tries again."""
        conversation = self.conversation
        refreshed = self.prompts.refreshed(self.context)
        if refreshed is not None and conversation.messages:
            conversation.messages[0] = {"role": "system", "content": refreshed}
        record = await conversation.compact_if_near_window(index)
        if record is not None and iteration is not None:
            iteration.compaction = record
        turn = new_turn()
        try:
            return await self._ask_root(conversation.messages + list(extra), turn, iteration), turn
        except LLMQueryError as exc:
            if not is_context_error(exc) or turn.ran:
                raise
        record = await conversation.compact(index, "context error")
        if iteration is not None:
            iteration.compaction = record
        turn = new_turn()
        try:
            return await self._ask_root(conversation.messages + list(extra), turn, iteration), turn
        except PromptTooLongError as exc:
            # Not a sub-call's "split it": the conversation was just compacted, and
            # what is left (system prompt, question, summary) is still too long.
            raise LLMQueryError(
                self.settings.model,
                (
                    f"the root conversation is about {exc.tokens:,} tokens even after "
                    f"compaction, and the root model takes {exc.room:,}: use a root model "
                    "with a larger window (RLM.model), or a shorter question"
                ),
            ) from None

    async def _ask_root(
        self, messages: list[dict[str, Any]], turn: LiveTurn, iteration: Iteration | None = None
    ) -> str:
        """One root turn, streamed into ``turn`` (the panel shows it; with early
        execution its finished blocks start running). If the turn fails after some of
        its blocks ran, it is not asked again (its code would run twice): the partial
        turn stands, with its outputs, and the model is told where it was cut off."""
        finishing = self.finishing
        if self.depth == 0:
            self.tree.live_turn = turn
        try:
            completion = await self.client.complete(
                messages,
                model=self.settings.model,
                max_tokens=self.settings.max_tokens,
                ledger=self.tree.ledger,
                stream=True,
                on_text=turn,
                cache_prefix=True,
                deadline=self.calls.outer_deadline,
                may_retry=lambda: not turn.ran,
            )
        except BaseException as exc:
            if turn.ran and iteration is not None and isinstance(exc, Exception):
                # Cut off after its code ran: the partial turn stands, and _act_on lets
                # its blocks finish.
                iteration.broken_off = describe_exception(exc)
                iteration.early_blocks = turn.ran
                finishing.cut_off = "before its end"  # its text ends where it broke off
                return turn.text
            await turn.cancel()
            if turn.ran and iteration is not None:  # interrupted: keep what ran
                iteration.response = turn.text
                self.result.trajectory.append(iteration)
            raise
        finally:
            if self.depth == 0:
                self.tree.live_turn = None
        if iteration is not None:
            iteration.early_blocks = turn.ran
        # Stopped at max_tokens or broken off: either way its FINAL may be cut short.
        finishing.cut_off = (
            ""
            if not completion.incomplete
            else "at max_tokens"
            if completion.cut_off
            else "before its end"
        )
        # A turn that broke off (a stall, a server gone) is kept as far as it came; a
        # block it left unclosed is not run (it may be half written).
        finishing.broken_off = completion.cut_reason
        if finishing.broken_off and iteration is not None:
            iteration.broken_off = finishing.broken_off
        return completion.text

    async def _share_history(self, history: list[dict[str, Any]]) -> None:
        """The whole conversation as the REPL variable ``history``, redacted as all that
        the model's code can see is (the sandbox's code must not read a secret either)."""
        shared = await redact_messages([dict(m) for m in history], self.client.redactor())
        if self.repl is not None:
            await self.repl.set_variable("history", shared)

    # -- the reply's code ------------------------------------------------------------------
    async def _act_on(
        self,
        reply: str,
        iteration: Iteration,
        turn: LiveTurn | None = None,
        outputs: list[str] | None = None,
    ) -> tuple[str, tuple[str, str] | None]:
        """Run the reply's code; return (feedback for the model, (final answer, how it
        was given) or None)."""
        finishing = self.finishing
        reading = finishing.read(reply)
        blocks = reading.blocks
        outputs = outputs if outputs is not None else []
        if turn is not None and self.settings.early_execution:
            await turn.finish(blocks)  # the blocks not started while streaming, in order
            if turn.stopped:
                return "", finishing.finished
        else:
            for number, code in enumerate(blocks, 1):
                if await self._run_block(number, code, iteration, outputs):
                    return "", finishing.finished
        marker, problems = finishing.readable(reading)
        if marker is not None:
            answer, problem = await finishing.resolve(marker, iteration)
            if answer is not None:
                return "", (answer, "text marker")
            problems = [problem]
        outputs += problems
        if not blocks and marker is None and not problems:
            outputs.append(
                f"You wrote no ```repl code and gave no final answer. To finish: {ACCEPTED_FORMS}."
            )
        return "\n\n".join([*outputs, CONTINUE_PROMPT]), None

    async def _run_block(
        self, number: int, code: str, iteration: Iteration, outputs: list[str]
    ) -> bool:
        """Run one block; True when the model's code gave the run its answer."""
        repl = self.repl
        assert repl is not None  # blocks run only once the workspace is open
        self._status("running code")
        # Sub-calls of this step must end in time for the step to end with their
        # results and errors in hand: they get a deadline a little before the step's.
        timeout = self.settings.step_timeout
        outer = self.calls.outer_deadline
        if outer is not None:
            # A child run: its step must be stopped, and unwound, before the parent's
            # step ends (a stopped step's thread gets up to half a second to unwind).
            timeout = max(0.1, min(timeout, outer - time.monotonic() - 0.5))
        # A tenth of the step, at least half a second (less only for very short steps:
        # a quarter of them), at most two.
        margin = min(2.0, max(0.1 * timeout, min(0.5, timeout / 4)))
        self.calls.step_deadline = time.monotonic() + timeout - margin
        cut_before = self.calls.cut_answers
        try:
            step = await repl.run(code, timeout=timeout)
        except BaseException:
            # Interrupted mid-step: keep what the step printed in the trajectory.
            partial = repl.last_output
            if partial is not None:
                shown = self.client.redactor().head(
                    partial.as_text(), self.settings.max_output_chars
                )
                iteration.code.append(CodeRun(code, shown, partial.elapsed_s, error=True))
            raise
        finally:
            self.calls.step_deadline = None
            if self.tree.live_turn is not None and self.depth == 0:
                self._status("thinking")  # an early block ended; the model still writes
        seen = await self._as_model_sees_it(step.as_text(), step.dropped_chars)
        cut = self.calls.cut_answers - cut_before
        if cut:
            iteration.cut_answers += cut
            seen += (
                f"\n[{cut} sub-call answer{'s' if cut > 1 else ''} of this step "
                f"{'are' if cut > 1 else 'is'} cut off (stopped at max_tokens, or "
                "broken off); ask for shorter answers or smaller pieces]"
            )
        seen += self.finishing.restored_note(step.restored)
        finish = step.finish
        if finish and step.error is not None:
            # An answer given before the block failed or was stopped is not taken: the
            # failure may be the check that should have kept it from being the answer.
            called = "answer['ready'] was set" if finish[0] == "answer dict" else "FINAL was called"
            failure = step.error.strip().splitlines()[-1]
            seen += f"\n[{called}, but the block then failed: {failure}; the run goes on]"
            finish = None
        iteration.code.append(CodeRun(code, seen, step.elapsed_s, error=step.error is not None))
        outputs.append(f"Output of block {number}:\n{seen}")
        return await self.finishing.by_block(finish, outputs, iteration)

    async def _as_model_sees_it(self, text: str, dropped: int = 0) -> str:
        """Step output as the model sees it: secrets removed, cut to max_output_chars
        with a note. ``dropped``: characters the sandbox already left out."""
        limit = self.settings.max_output_chars
        redact = self.client.redactor()
        if len(text) <= limit:
            return await off_loop_if_large(len(text), redact, text)
        head = await off_loop_if_large(limit, redact.head, text, limit)
        return (
            head + f"\n... [output cut: {len(text) + dropped - limit:,} more characters not "
            "shown; print smaller slices]"
        )

    # -- budgets -----------------------------------------------------------------------------
    def _stopped_by_budget(self, result: RLMResult) -> bool:
        self._warn_if_budget_is_blind()
        if not self.tree.over_budget():
            return False
        result.stop_reason = "budget"
        result.error = (
            f"cost budget exceeded: spent ${self.tree.ledger.cost_usd:.4f} of "
            f"max_cost_usd=${self.tree.max_cost_usd:g}"
        )
        return True

    def _warn_if_budget_is_blind(self) -> None:
        tree = self.tree
        if tree.max_cost_usd is None or tree.warned_unpriced:
            return
        unpriced = [
            row.model for row in tree.ledger.summary().by_model.values() if row.unpriced_calls
        ]
        if unpriced:
            tree.warned_unpriced = True
            warnings.warn(
                f"max_cost_usd is set, but litellm has no price for "
                f"{', '.join(unpriced)}: those calls count as $0 against the "
                "budget",
                RuntimeWarning,
                stacklevel=2,
            )

    # -- child runs and the status panel ---------------------------------------------------
    async def _child_run(self, prompt: str, context: Any, deadline: float | None) -> RLMResult:
        """A child RLM for ``rlm_query``: the sub-model as its root, this run's tree."""
        settings = self.settings
        child = Run(
            self.config,
            self.client,
            prompt,
            context,
            model=settings.sub_model,
            sub_model=settings.sub_model,
            max_iterations=settings.max_iterations,
            max_depth=settings.max_depth,
            sandbox=settings.sandbox,
            depth=self.depth + 1,
            tree=self.tree,
            deadline=deadline,
        )
        return await child.execute()

    def _status(self, phase: str, iteration: int | None = None) -> None:
        if self.depth == 0:
            self.tree.phase = phase
            if iteration is not None:
                self.tree.iteration = iteration
                self.tree.max_iterations = self.settings.max_iterations


def _where_code_runs(
    asked: str | None, configured: str, namespace: dict[str, Any] | None, session: RLMSession | None
) -> str:
    """ "process" or "none": never sandboxed in the notebook's namespace; a session's REPL
    runs where it began."""
    where = "none" if namespace is not None else (asked or configured)
    if session is not None:
        if asked is not None and asked != session.sandbox:
            kept = "in a sandbox process" if session.sandbox == "process" else "in this kernel"
            raise ConfigError(
                f"session {session.name!r} runs its code {kept}; it "
                f"cannot switch to sandbox={asked!r}"
            )
        where = session.sandbox  # the REPL it keeps
    if where not in ("process", "none"):
        raise ValueError(f"sandbox must be 'process' or 'none', got {where!r}")
    return where
