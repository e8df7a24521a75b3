"""Asking the root model for a turn of the conversation.

The conversation is compacted first when it nears the model's window, and once more
when the provider refuses it as too long anyway. The answer streams into a ``LiveTurn``:
the status panel shows it and, with early execution, its finished blocks start running
while the model still writes. A turn that fails after some of its blocks ran is not
asked again (its code would run twice): what arrived stands, and the model is told where
it was cut off. A turn that begins to guess what its code prints is stopped there
(``seen_output``: the guess and all after it would be left out). ``finishing`` hears
where a turn was cut, which decides whether a final answer in it may be taken.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from ..errors import LLMQueryError, PromptTooLongError, describe_exception
from ..llm.redaction import off_loop_if_large
from ..llm.windows import is_context_error
from .compaction import Conversation
from .finishing import Finishing
from .live_turn import LiveTurn
from .result import Iteration

if TYPE_CHECKING:
    from ..llm.completion import Completion
    from .scope import RunScope


class RootTurns:
    """The root model's turns of one run."""

    def __init__(self, scope: RunScope, conversation: Conversation, finishing: Finishing):
        self.scope, self.conversation, self.finishing = scope, conversation, finishing
        self.client, self.tree, self.result = scope.client, scope.tree, scope.result
        self.model, self.max_tokens = scope.settings.model, scope.settings.max_tokens
        self.depth = scope.depth
        self.deadline = scope.deadline  # a child run's: its parent's step must end in time

    async def ask(
        self,
        index: int,
        iteration: Iteration | None,
        new_turn: Callable[[], LiveTurn],
        extra: Sequence[dict[str, Any]] = (),
    ) -> tuple[str, LiveTurn]:
        """Turn ``index``: its reply and the turn it streamed into."""
        conversation = self.conversation
        record = await conversation.compact_if_near_window(index)
        if record is not None and iteration is not None:
            iteration.compaction = record
        turn = new_turn()
        try:
            return await self._ask(conversation.messages + list(extra), turn, iteration), turn
        except LLMQueryError as exc:
            if not is_context_error(exc) or turn.ran:
                raise
        record = await conversation.compact(index, "context error")
        if iteration is not None:
            iteration.compaction = record
        turn = new_turn()
        try:
            return await self._ask(conversation.messages + list(extra), turn, iteration), turn
        except PromptTooLongError as exc:
            # Not a sub-call's "split it": the conversation was just compacted, and
            # what is left (system prompt, question, summary) is still too long.
            raise LLMQueryError(
                self.model,
                (
                    f"the root conversation is about {exc.tokens:,} tokens even after "
                    f"compaction, and the root model takes {exc.room:,}: use a root model "
                    "with a larger window (RLM.model), or a shorter question"
                ),
            ) from None

    @staticmethod
    async def _answer(call: asyncio.Future[Completion], turn: LiveTurn) -> Completion | None:
        """The call's completion, or None when ``turn`` stopped it at a guess of its
        code's output. An interrupt of this task stops the call too."""
        try:
            await asyncio.wait({call})
        except asyncio.CancelledError:
            call.cancel()
            await asyncio.wait({call})
            raise
        if call.cancelled() and turn.guessed:
            return None
        return call.result()

    async def _ask(
        self, messages: list[dict[str, Any]], turn: LiveTurn, iteration: Iteration | None = None
    ) -> str:
        """One root turn, streamed into ``turn``, redacted: the reply becomes the
        trajectory, the log, the HTML view and perhaps the final answer, and a model may
        echo a key it was never shown (a guess, a form redaction let through)."""
        redact = self.client.redactor()
        turn.redact = redact  # (blocks run early run as the reply will hold them)
        reply = await self._streamed(messages, turn, iteration)
        return await off_loop_if_large(len(reply), redact, reply)

    async def _streamed(
        self, messages: list[dict[str, Any]], turn: LiveTurn, iteration: Iteration | None
    ) -> str:
        if self.depth == 0:
            self.tree.live_turn = turn
        call = asyncio.ensure_future(
            self.client.complete(
                messages,
                model=self.model,
                max_tokens=self.max_tokens,
                ledger=self.tree.ledger,
                stream=True,
                on_text=turn,
                cache_prefix=True,
                deadline=self.deadline,
                may_retry=lambda: not turn.ran,
            )
        )
        turn.on_guess = call.cancel
        try:
            completion = await self._answer(call, turn)
        except BaseException as exc:
            if turn.ran and iteration is not None and isinstance(exc, Exception):
                # Cut off after its code ran: the partial turn stands, and the run lets
                # its blocks finish.
                iteration.broken_off = describe_exception(exc)
                iteration.early_blocks = turn.ran
                self.finishing.cut_off = "before its end"  # its text ends where it broke off
                return turn.text
            await turn.cancel()
            if turn.ran and iteration is not None:  # interrupted: keep what ran
                iteration.response = self.client.redactor()(turn.text)
                self.result.trajectory.append(iteration)
            raise
        finally:
            if self.depth == 0:
                self.tree.live_turn = None
        if iteration is not None:
            iteration.early_blocks = turn.ran
        return self._ended(completion, turn, iteration)

    def _ended(
        self, completion: Completion | None, turn: LiveTurn, iteration: Iteration | None
    ) -> str:
        """The text of a turn that ended, ``finishing`` told where it was cut (which
        decides whether a FINAL in it may be taken)."""
        finishing = self.finishing
        if completion is None:
            # Stopped where the model began to guess its code's output: the text up to
            # there is the turn. The call's tokens so far are in the ledger, as a
            # cancelled call (nothing went wrong).
            if iteration is not None:
                iteration.notes.append(
                    "the reply was stopped where it began to guess what its code prints"
                )
            finishing.cut_off, finishing.broken_off = "", None
            return turn.text
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
