"""The root model's conversation, kept within its context window.

When the conversation nears the window (``RLM.compact_at`` of it), or the provider
refuses it as too long, the root model summarises its progress and the conversation
restarts from the system prompt, the question and that summary. Every message, compacted
or not, stays in ``history``, which the REPL gets as the variable ``history``.

The summary must fit the window it is written in (a 4,096-token local model too): it
is streamed (a slow model is watched for stalls, not cut at a total), its budget is a
share of the window and at most half of what it replaces, and a summary that still
comes out larger than what it replaces is cut to that size. A summary that stops at its
budget or breaks off is asked for once more, shorter; one that breaks off again is a
``CompactionError``, one cut at its budget again is kept, marked and recorded as cut.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, cast

from ..errors import CompactionError, LLMQueryError
from ..llm.windows import answer_room, chars_per_token, estimate_tokens, is_context_error
from .prompts import AFTER_COMPACTION_PROMPT, SUMMARY_PROMPT
from .result import Compaction

if TYPE_CHECKING:
    from ..llm.client import LLMClient
    from ..llm.completion import Completion
    from ..llm.usage import UsageLedger
    from .scope import RunScope


class Conversation:
    """The root conversation of one run: what the model is sent (``messages``) and
    everything it was ever sent or wrote (``history``)."""

    def __init__(
        self,
        client: LLMClient,
        *,
        model: str,
        max_tokens: int,
        compact_at: float,
        ledger: UsageLedger,
        deadline: float | None,
        share_history: Callable[[list[dict[str, Any]]], Awaitable[None]],
        status: Callable[[str], None],
        compactions: list[Compaction],
    ):
        self.client = client
        self.model = model
        self.max_tokens = max_tokens
        self.compact_at = compact_at
        self.ledger = ledger
        self.deadline = deadline
        self._share_history = share_history  # puts `history` into the REPL
        self._status = status
        self.compactions = compactions  # the result's list: records are added to it
        self.messages: list[dict[str, Any]] = []
        self.history: list[dict[str, Any]] = []

    @classmethod
    def for_run(cls, scope: RunScope) -> Conversation:
        """The root conversation of the run whose scope this is: its root model, its
        ledger, and its REPL's ``history``."""
        settings = scope.settings
        return cls(
            scope.client,
            model=settings.model,
            max_tokens=settings.max_tokens,
            compact_at=settings.compact_at,
            ledger=scope.ledger,
            deadline=scope.deadline,
            share_history=scope.share_history,
            status=scope.status,
            compactions=scope.result.compactions,
        )

    def start(self, system: str, first: str) -> None:
        self.messages = [{"role": "system", "content": system}, {"role": "user", "content": first}]
        self.history = list(self.messages)  # every message, compactions or not
        self._compacted_length = len(self.messages)
        self._compacted_size = self.size()

    def size(self, messages: list[dict[str, Any]] | None = None) -> int:
        """Estimated tokens of ``messages`` (the conversation's), as the model reads."""
        return estimate_tokens(self.messages if messages is None else messages, self.model)

    def add(self, reply: str, feedback: str) -> None:
        exchange = [{"role": "assistant", "content": reply}, {"role": "user", "content": feedback}]
        self.messages += exchange
        self.history += exchange

    def room(self) -> int | None:
        """Tokens the root model takes as a prompt (its window less the answer's)."""
        window = self.client.input_window(self.model, advice=True)
        if window is None:
            return None
        return window - answer_room(window, self.max_tokens, self.model)

    async def compact_if_near_window(self, index: int) -> Compaction | None:
        room = self.room()
        # Only a conversation that grew since it started (or was last compacted), and
        # by a quarter of the room: when the question and a summary alone sit near the
        # threshold, each turn would otherwise pay for another summary.
        if room is None or len(self.messages) <= self._compacted_length:
            return None
        size = self.size()
        if size > self.compact_at * room and size - self._compacted_size >= room / 4:
            try:
                self._summary_room(size, self.size(self.messages[2:]))
            except CompactionError:
                return None  # no summary fits: the turn may still (a refusal then says)
            return await self.compact(index, "threshold")
        return None

    async def compact(self, index: int, reason: str) -> Compaction:
        """The root model summarises its progress; the conversation restarts from the
        system prompt, the question and that summary. The full history goes into the
        REPL variable ``history`` first, so nothing the model saw is lost."""
        self._status("compacting")
        before = self.size()
        await self._share_history(self.history)
        replaced = self.size(self.messages[2:])  # what the summary stands in for
        completion = await self._summarise(before, replaced)
        spent = [completion]
        if completion.incomplete:
            # A summary that stopped at its budget or broke off (a stall) would stand in
            # for the whole conversation cut short: asked once more, for half as much.
            completion = await self._summarise(before, replaced, shorter=True)
            spent.append(completion)
            if completion.cut_reason is not None:
                raise CompactionError(
                    f"the root model's conversation (~{before:,} tokens) could not be "
                    f"compacted: its summary broke off twice ({completion.cut_reason})"
                )
        text = completion.text.strip() or "(the model wrote no summary)"
        if completion.cut_off:  # kept, as far as it came, and said so
            text += "\n[summary cut off at its max_tokens]"
        summary = _no_larger(text, replaced, chars_per_token(self.model))
        number = len(self.compactions) + 1
        self.history += [
            {"role": "user", "content": SUMMARY_PROMPT},
            {"role": "assistant", "content": summary},
        ]
        self.messages = [
            *self.messages[:2],
            {"role": "assistant", "content": summary},
            {"role": "user", "content": AFTER_COMPACTION_PROMPT.format(number=number)},
        ]
        await self._share_history(self.history)
        self._compacted_length = len(self.messages)
        self._compacted_size = self.size()
        costs = [c.cost_usd for c in spent]
        record = Compaction(
            index,
            reason,
            before,
            self._compacted_size,
            sum(c.input_tokens for c in spent),
            sum(c.output_tokens for c in spent),
            None if None in costs else sum(cast("list[float]", costs)),
            summary,
            cut_off=completion.cut_off,
        )
        self.compactions.append(record)
        self._status("thinking")
        return record

    async def _summarise(self, before: int, replaced: int, shorter: bool = False) -> Completion:
        """One summary call (``shorter``: with half its budget, and asked to end well
        within it). A prompt refused as too long is cut further and sent once more."""
        for share in (0.9, 0.6):  # the estimate may be short for code: then less
            budget, room = self._summary_room(before, replaced)
            prompt = SUMMARY_PROMPT
            if shorter:
                # Half the budget too, not only the words asked for: a model that writes
                # past its room again then costs half a call, not a whole one. The words
                # (~0.75 a token) leave a fifth of it spare.
                budget = max(32, budget // 2)
                prompt += (
                    f" Your last summary did not end within its room: keep this "
                    f"one under {max(20, int(budget * 0.6)):,} words."
                )
            request = _with_user_message(
                _fitted(self.messages, int(room * share), self.model), prompt
            )
            try:
                return await self.client.complete(
                    request,
                    model=self.model,
                    max_tokens=budget,
                    ledger=self.ledger,
                    deadline=self.deadline,
                    stream=True,
                )
            except LLMQueryError as exc:
                if share == 0.6 or not is_context_error(exc):
                    raise CompactionError(
                        f"the root model's conversation (~{before:,} tokens) could not be "
                        f"compacted: its summary call failed: {exc}"
                    ) from exc
                # The refusal taught the window (or the model's characters per token).
        raise AssertionError("unreachable")

    def _summary_room(self, before: int, replaced: int) -> tuple[int, int]:
        """(the summary's max_tokens, the tokens its request may take). The summary
        gets a quarter of the window at most, and half of what it replaces; the
        request, the rest of the window. A window too small for the system prompt,
        the question and a summary beside them is a failure of its own."""
        window = self.client.input_window(self.model, advice=True)
        budget = max(
            64, min(self.max_tokens, replaced // 2, window // 4 if window else self.max_tokens)
        )
        if window is None:
            return budget, max(256, before // 2)
        head = self.size(self.messages[:2]) + self.size(
            [{"role": "user", "content": SUMMARY_PROMPT}]
        )
        room = window - budget
        if room - head < 128:  # not even the latest exchange would fit beside them
            raise CompactionError(
                f"the root model's window of {window:,} tokens cannot hold its system "
                f"prompt and the question (~{head:,} tokens) with a summary of "
                f"{budget:,} tokens beside them, so its conversation cannot be compacted: "
                "use a root model with a larger window (RLM.model), or a shorter "
                "question or system prompt"
            )
        return budget, room


def _no_larger(summary: str, replaced: int, per_token: float) -> str:
    """A summary never takes more room than what it replaces."""
    limit = int(replaced * per_token * 0.9)
    if len(summary) <= limit:
        return summary
    return summary[: max(0, limit - 60)] + "\n[summary cut to fit the conversation it replaces]"


def _fitted(
    messages: list[dict[str, Any]], room: int, model: str | None = None
) -> list[dict[str, Any]]:
    """The conversation cut to about ``room`` tokens for its summary: the system prompt
    and question, then the latest exchanges that fit (the oldest are left out whole;
    a single exchange too big alone keeps its head and tail)."""

    def estimate(part: list[dict[str, Any]]) -> int:
        return estimate_tokens(part, model)

    head, tail = messages[:2], messages[2:]
    budget = max(64, room - estimate(head))
    left_out = 0
    while len(tail) > 2 and estimate(tail) > budget:
        tail, left_out = tail[2:], left_out + 2  # whole (assistant, user) exchanges
    if estimate(tail) > budget:
        share = max(200, int(budget * chars_per_token(model)) // max(1, len(tail)))
        tail = [
            {**m, "content": _head_and_tail(m["content"], share)}
            if isinstance(m.get("content"), str)
            else m
            for m in tail
        ]
    if left_out:
        note = {
            "role": "user",
            "content": f"[{left_out} earlier messages are left out here to fit your window]",
        }
        return [*head, {"role": "assistant", "content": "(working)"}, note, *tail]
    return [*head, *tail]


def _with_user_message(messages: list[dict[str, Any]], text: str) -> list[dict[str, Any]]:
    """``text`` as the next user message; joined to the last one if that is the
    user's too (some providers refuse two user messages in a row)."""
    last = messages[-1]
    if last.get("role") == "user" and isinstance(last.get("content"), str):
        return [*messages[:-1], {**last, "content": f"{last['content']}\n\n{text}"}]
    return [*messages, {"role": "user", "content": text}]


def _head_and_tail(text: str, size: int) -> str:
    if len(text) <= size:
        return text
    half = size // 2
    return f"{text[:half]}\n... [{len(text) - size:,} characters cut] ...\n{text[-half:]}"
