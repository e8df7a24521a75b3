"""The RLM loop: a root model answers a question by writing code in a REPL where the
context is a variable, calling sub-models on pieces of it, until it gives its answer.

One turn of the loop: the root model is asked (``root_turns``: the conversation is
compacted first if it nears the model's window; the answer streams in, and with early
execution its finished blocks start running while it still writes); its reply's blocks
run in the REPL (``code_runs``: within a step's time, output redacted and cut to what
the model may read); and the run ends when an answer is taken (``finishing``), the
budget is spent (``tree``), or the turns run out (one last turn then asks for the
answer).

A ``Run`` holds one run's state, so several runs of one ``RLM`` (and a run's child runs,
for ``rlm_query``) go on at once. Where the REPL lives is ``workspace``'s business, what
the model is told ``prompts``', and what the REPL's helpers do ``subcalls``'. What these
parts share (settings, client, tree, result, depth, deadline, the status panel) is the
run's ``scope``.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from typing import TYPE_CHECKING, Any

from ..errors import BudgetExceededError, describe_exception
from ..repl.base import REPL
from ..repl.finishers import FinishKind
from .code_runs import CodeRuns
from .compaction import Conversation
from .finishing import Finishing, is_error
from .finishing.echoes import Echoes
from .finishing.seen_output import as_seen, told
from .live_turn import LiveTurn
from .prompts import (
    CONTINUE_PROMPT,
    ITERATION_LIMIT_PROMPT,
    RunPrompts,
    context_sample,
    set_by_user,
)
from .replies import ACCEPTED_FORMS, read_final_call
from .result import Iteration, RLMResult
from .root_turns import RootTurns
from .scope import RunOverrides, RunScope
from .subcalls import SubCalls
from .workspace import Workspace

if TYPE_CHECKING:
    from ..config import RLMConfig
    from ..llm.client import LLMClient
    from .tree import RunTree

_run_ids = itertools.count(1)


class Run:
    """One RLM run (root or child): its REPL, conversation and result. ``config``: the
    ``RLM`` it runs for (its settings are read once, here); ``client``: the client all of
    its calls go through; ``overrides``: what the caller set for this run; ``tree``: see
    ``RunScope.of`` (None: a run tree of its own)."""

    def __init__(
        self,
        config: RLMConfig,
        client: LLMClient,
        query: str,
        context: Any = None,
        overrides: RunOverrides | None = None,
        *,
        tree: RunTree | RunScope | None = None,
    ):
        overrides = overrides or RunOverrides()
        self.scope = scope = RunScope.of(config, client, query, overrides, tree)
        self.config, self.client, self.settings = config, client, scope.settings
        self.tree, self.result, self.depth = scope.tree, scope.result, scope.depth
        self.id, self.query, self.context = next(_run_ids), query, context
        self.namespace, self.session = overrides.namespace, overrides.kept_session()
        # What the REPL's helpers call: pinned sub-model, budgets, errors as values.
        self.calls = SubCalls(scope, self._child_run)
        self.prompts = RunPrompts(scope, config.system_prompt)
        self.finishing = self._finishing()
        self.conversation = Conversation.for_run(scope)  # compacted to fit the window
        self.root = RootTurns(scope, self.conversation, self.finishing)
        self.workspace: Workspace | None = None
        self.code_runs: CodeRuns | None = None  # once the workspace is open

    def _finishing(self) -> Finishing:
        """What decides that the run finished, and with what (``finishing``)."""
        finishing = Finishing(self.result)
        finishing.step_timeout = self.settings.step_timeout
        # A session's variables from its earlier questions, by the question they came from.
        session = self.session
        finishing.carried_from = dict(session.origins) if session is not None else {}
        finishing.echoes = Echoes(
            [self.prompts.template, CONTINUE_PROMPT, ITERATION_LIMIT_PROMPT, ACCEPTED_FORMS],
            question=self.query,
        )
        return finishing

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
                self.scope, self.context, self.calls.helpers(), self.namespace, self.session
            )
            self.scope.repl = self.finishing.repl = await workspace.open()
            self.context = workspace.context  # a session's latest, when none was given
            self.code_runs = CodeRuns(self.scope, self.calls, self.finishing)
            await self._loop(result)
        except asyncio.CancelledError:
            result.stop_reason, result.error = "interrupted", "interrupted by the user"
            raise
        except Exception as exc:  # noqa: BLE001 - the run fails, the result keeps it
            refused = _budget_refusal(exc)
            if refused is not None:  # a root turn (or its summary) the budget had no room for
                result.stop_reason, result.error = (
                    "budget",
                    f"stopped by the cost budget: {refused}",
                )
            else:
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
            self.finishing.settle_empty()
            result.success = result.stop_reason == "final"
            result.iterations = len(result.trajectory)
            result.usage = self.tree.ledger.summary()
            result.elapsed_s = time.perf_counter() - started
        return result

    async def _loop(self, result: RLMResult) -> None:
        settings = self.settings
        # litellm's model info gives the windows the prompt advises by (and a local
        # server's tokenizer the characters per token of this context).
        await self.client.look_up_windows(
            settings.model, settings.sub_model, sample=context_sample(self.context)
        )
        if self.code_runs is not None:  # a step's output fits beside the conversation
            self.code_runs.max_output_chars = self.prompts.fit_output(
                settings.model, set_by_user(self.config, "max_output_chars")
            )
        self.conversation.start(
            self.prompts.system(self.context),
            self.prompts.first_message(self.query, self.session),
        )
        for index in range(1, settings.max_iterations + 1):
            self.scope.status("thinking", iteration=index)
            turn_started = time.perf_counter()
            calls_before = self.calls.own
            iteration = Iteration(index=index, response="")
            self.finishing.next_turn()
            outputs: list[str] = []

            def new_turn(
                iteration: Iteration = iteration, outputs: list[str] = outputs
            ) -> LiveTurn:
                return LiveTurn(
                    (lambda n, code: self._run_block(n, code, iteration, outputs))
                    if settings.early_execution
                    else None
                )

            self._refresh_system_prompt()
            reply, turn = await self.root.ask(index, iteration, new_turn)
            iteration.response = reply
            result.trajectory.append(iteration)
            feedback, final, seen = await self._act_on(reply, iteration, turn, outputs)
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
                await self.finishing.note_carried(final[0], iteration)
                return
            spent = self.tree.budget_spent()
            if spent is not None:
                result.stop_reason, result.error = "budget", spent
                return
            self.conversation.add(seen, feedback)
        await self._last_turn(result)

    async def _last_turn(self, result: RLMResult) -> None:
        """Out of iterations: one last chance to answer, without running code."""
        limit = self.settings.max_iterations
        self.scope.status("thinking", iteration=limit)
        self._refresh_system_prompt()
        reply, _ = await self.root.ask(
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
            result.finished_by = FinishKind.TEXT_MARKER.value
            await self.finishing.note_carried(answer)
        else:
            result.final_answer = reply.strip() or None
            result.stop_reason = "max_iterations"
            result.error = (
                f"no FINAL answer within max_iterations={limit}; "
                "final_answer holds the model's last reply"
            )

    async def _run_block(
        self, number: int, code: str, iteration: Iteration, outputs: list[str]
    ) -> bool:
        """Run one block (see ``code_runs``); True when it gave the run its answer."""
        assert self.code_runs is not None  # blocks run only once the workspace is open
        return await self.code_runs.run(number, code, iteration, outputs)

    def _refresh_system_prompt(self) -> None:
        """A system prompt written again before a turn when its advice changed (a window
        learned since: ``RunPrompts.refreshed``)."""
        system = self.prompts.refreshed(self.context)
        if system is not None and self.conversation.messages:
            self.conversation.messages[0] = {"role": "system", "content": system}

    # -- the reply's code ------------------------------------------------------------------
    async def _act_on(
        self,
        reply: str,
        iteration: Iteration,
        turn: LiveTurn | None = None,
        outputs: list[str] | None = None,
    ) -> tuple[str, tuple[str, str] | None, str]:
        """Run the reply's code; return (feedback for the model, (final answer, how it
        was given) or None, the reply as the conversation keeps it). The reply is read
        only up to where it begins to guess its code's output (``seen_output``)."""
        finishing = self.finishing
        reading = finishing.read(reply, until_guess=True)
        blocks = reading.blocks
        outputs = outputs if outputs is not None else []
        if turn is not None and self.settings.early_execution:
            await turn.finish(blocks)  # the blocks not started while streaming, in order
            if turn.stopped:
                return "", finishing.finished, reply
        else:
            for number, code in enumerate(blocks, 1):
                if await self._run_block(number, code, iteration, outputs):
                    return "", finishing.finished, reply
        marker, problems = finishing.readable(reading)
        if marker is not None:
            answer, problem = await finishing.from_text(marker, iteration)
            if answer is not None:
                return "", (answer, FinishKind.TEXT_MARKER.value), reply
            problems = [problem] if problem else []
        outputs += problems
        seen = as_seen(reply, reading, iteration)
        withheld = told(iteration)
        if withheld is not None:
            outputs.append(withheld)
        elif not blocks and marker is None and not problems:
            outputs.append(
                f"You wrote no ```repl code and gave no final answer. To finish: {ACCEPTED_FORMS}."
            )
        return "\n\n".join([*outputs, CONTINUE_PROMPT]), None, seen

    # -- child runs and the status panel ---------------------------------------------------
    async def _child_run(self, prompt: str, context: Any) -> RLMResult:
        """A child RLM for ``rlm_query``: the sub-model as its root, this run's tree,
        within the step that asked for it."""
        child = Run(
            self.config, self.client, prompt, context, self.settings.for_child(), tree=self.scope
        )
        if not self.settings.sandbox.isolated:
            return await child.execute()
        async with self.tree.child_sandbox(child.depth):
            return await child.execute()


def _budget_refusal(exc: BaseException) -> BudgetExceededError | None:
    """The budget's refusal that ended the run (a compaction's wraps it), or None."""
    link: BaseException | None = exc
    while link is not None:
        if isinstance(link, BudgetExceededError):
            return link
        link = link.__cause__
    return None
