"""The model's code, run one block at a time as REPL steps, and what the model is told of
each: its output (secrets removed, cut to what the model may read), sub-call answers
that were cut off, names of the REPL's it rebound, and whether the block gave the run
its answer (``finishing``)."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from ..llm.redaction import off_loop_if_large
from ..repl.finishers import FinishKind
from .finishing import Finishing
from .result import CodeRun, Iteration

if TYPE_CHECKING:
    from .scope import RunScope
    from .subcalls import SubCalls


class CodeRuns:
    """Runs a run's blocks in its REPL (the scope's, once open), each within the
    step's time."""

    def __init__(self, scope: RunScope, calls: SubCalls, finishing: Finishing):
        self.scope, self.calls, self.finishing = scope, calls, finishing
        self.client, self.tree = scope.client, scope.tree
        self.step_timeout = scope.settings.step_timeout
        # What the model may read of a step (the run fits it to the root model's window).
        self.max_output_chars = scope.settings.max_output_chars

    async def run(self, number: int, code: str, iteration: Iteration, outputs: list[str]) -> bool:
        """Run block ``number``; its output goes to ``outputs`` (and the trajectory).
        True when the model's code gave the run its answer."""
        scope, calls = self.scope, self.calls
        repl = scope.repl
        assert repl is not None  # blocks run once the workspace is open
        scope.status("running code")
        # Sub-calls of this step must end in time for the step to end with their
        # results and errors in hand: they get a deadline a little before the step's.
        timeout = self.step_timeout
        outer = scope.deadline
        if outer is not None:
            # A child run: its step must be stopped, and unwound, before the parent's
            # step ends (a stopped step's thread gets up to half a second to unwind).
            timeout = max(0.1, min(timeout, outer - time.monotonic() - 0.5))
        # A tenth of the step, at least half a second (less only for very short steps:
        # a quarter of them), at most two.
        margin = min(2.0, max(0.1 * timeout, min(0.5, timeout / 4)))
        scope.step_deadline = time.monotonic() + timeout - margin
        cut_before = calls.cut_answers
        try:
            step = await repl.run(code, timeout=timeout)
        except BaseException:
            # Interrupted mid-step: keep what the step printed in the trajectory.
            partial = repl.last_output
            if partial is not None:
                shown = self.client.redactor().head(partial.as_text(), self.max_output_chars)
                iteration.code.append(CodeRun(code, shown, partial.elapsed_s, error=True))
            raise
        finally:
            scope.step_deadline = None
            if self.tree.live_turn is not None:
                scope.status("thinking")  # an early block ended; the model still writes
        seen = await self._as_model_sees_it(step.as_text(), step.dropped_chars)
        cut = calls.cut_answers - cut_before
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
            called = (
                "answer['ready'] was set"
                if finish[0] == FinishKind.ANSWER_DICT
                else "FINAL was called"
            )
            failure = step.error.strip().splitlines()[-1]
            seen += f"\n[{called}, but the block then failed: {failure}; the run goes on]"
            finish = None
        iteration.code.append(CodeRun(code, seen, step.elapsed_s, error=step.error is not None))
        outputs.append(f"Output of block {number}:\n{seen}")
        return await self.finishing.by_block(finish, outputs, iteration, number, code)

    async def _as_model_sees_it(self, text: str, dropped: int = 0) -> str:
        """Step output as the model sees it: secrets removed, cut to max_output_chars
        with a note. ``dropped``: characters the sandbox already left out."""
        limit = self.max_output_chars
        redact = self.client.redactor()
        if len(text) <= limit:
            return await off_loop_if_large(len(text), redact, text)
        head = await off_loop_if_large(limit, redact.head, text, limit)
        return (
            head + f"\n... [output cut: {len(text) + dropped - limit:,} more characters not "
            "shown; print smaller slices]"
        )
