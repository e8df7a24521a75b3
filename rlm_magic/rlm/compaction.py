"""The root model's conversation, kept within its context window.

When the conversation nears the window (``RLM.compact_at`` of it), or the provider
refuses it as too long, the root model summarises its progress and the conversation
restarts from the system prompt, the question and that summary. Every message, compacted
or not, stays in ``history``, which the REPL gets as the variable ``history``.
"""

from __future__ import annotations

from typing import Awaitable, Callable

from ..errors import LLMQueryError
from ..llm.windows import CHARS_PER_TOKEN, estimate_tokens, is_context_error, reserve_for_answer
from .prompts import AFTER_COMPACTION_PROMPT, SUMMARY_PROMPT
from .result import Compaction


class Conversation:
    """The root conversation of one run: what the model is sent (``messages``) and
    everything it was ever sent or wrote (``history``)."""

    def __init__(self, client, *, model: str, max_tokens: int, compact_at: float,
                 ledger, deadline: float | None,
                 share_history: Callable[[list[dict]], Awaitable[None]],
                 status: Callable[[str], None], compactions: list[Compaction]):
        self.client = client
        self.model = model
        self.max_tokens = max_tokens
        self.compact_at = compact_at
        self.ledger = ledger
        self.deadline = deadline
        self._share_history = share_history  # puts `history` into the REPL
        self._status = status
        self.compactions = compactions  # the result's list: records are added to it
        self.messages: list[dict] = []
        self.history: list[dict] = []

    def start(self, system: str, first: str) -> None:
        self.messages = [{"role": "system", "content": system},
                         {"role": "user", "content": first}]
        self.history = list(self.messages)  # every message, compactions or not
        self._compacted_length = len(self.messages)
        self._compacted_size = estimate_tokens(self.messages)

    def add(self, reply: str, feedback: str) -> None:
        exchange = [{"role": "assistant", "content": reply},
                    {"role": "user", "content": feedback}]
        self.messages += exchange
        self.history += exchange

    def room(self) -> int | None:
        """Tokens the root model takes as a prompt (its window less the answer's)."""
        window = self.client.input_window(self.model)
        if window is None:
            return None
        return window - reserve_for_answer(window, self.max_tokens)

    async def compact_if_near_window(self, index: int) -> Compaction | None:
        room = self.room()
        # Only a conversation that grew since it started (or was last compacted), and
        # by a quarter of the room: when the question and a summary alone sit near the
        # threshold, each turn would otherwise pay for another summary.
        if room is None or len(self.messages) <= self._compacted_length:
            return None
        size = estimate_tokens(self.messages)
        if size > self.compact_at * room and size - self._compacted_size >= room / 4:
            return await self.compact(index, "threshold")
        return None

    async def compact(self, index: int, reason: str) -> Compaction:
        """The root model summarises its progress; the conversation restarts from the
        system prompt, the question and that summary. The full history goes into the
        REPL variable ``history`` first, so nothing the model saw is lost."""
        self._status("compacting")
        before = estimate_tokens(self.messages)
        await self._share_history(self.history)
        room = self.room() or max(256, before // 2)
        for share in (0.8, 0.4):  # the estimate may be short for code: then less
            request = _with_user_message(_fitted(self.messages, int(room * share)),
                                         SUMMARY_PROMPT)
            try:
                completion = await self.client.complete(
                    request, model=self.model, max_tokens=self.max_tokens,
                    ledger=self.ledger, deadline=self.deadline)
                break
            except LLMQueryError as exc:
                if share == 0.4 or not is_context_error(exc):
                    raise
                room = self.room() or room  # the error may have taught the window
        summary = completion.text.strip() or "(the model wrote no summary)"
        number = len(self.compactions) + 1
        self.history += [{"role": "user", "content": SUMMARY_PROMPT},
                         {"role": "assistant", "content": summary}]
        self.messages = [*self.messages[:2], {"role": "assistant", "content": summary},
                         {"role": "user",
                          "content": AFTER_COMPACTION_PROMPT.format(number=number)}]
        await self._share_history(self.history)
        self._compacted_length = len(self.messages)
        self._compacted_size = estimate_tokens(self.messages)
        record = Compaction(index, reason, before, estimate_tokens(self.messages),
                            completion.input_tokens, completion.output_tokens,
                            completion.cost_usd, summary)
        self.compactions.append(record)
        self._status("thinking")
        return record


def _fitted(messages: list[dict], room: int) -> list[dict]:
    """The conversation cut to about ``room`` tokens for its summary: the system prompt
    and question, then the latest exchanges that fit (the oldest are left out whole;
    a single exchange too big alone keeps its head and tail)."""
    head, tail = messages[:2], messages[2:]
    budget = max(64, room - estimate_tokens(head))
    left_out = 0
    while len(tail) > 2 and estimate_tokens(tail) > budget:
        tail, left_out = tail[2:], left_out + 2  # whole (assistant, user) exchanges
    if estimate_tokens(tail) > budget:
        share = max(200, budget * CHARS_PER_TOKEN // max(1, len(tail)))
        tail = [{**m, "content": _head_and_tail(m["content"], share)}
                if isinstance(m.get("content"), str) else m for m in tail]
    if left_out:
        note = {"role": "user", "content": f"[{left_out} earlier messages are left out "
                                           "here to fit your window]"}
        return [*head, {"role": "assistant", "content": "(working)"}, note, *tail]
    return [*head, *tail]


def _with_user_message(messages: list[dict], text: str) -> list[dict]:
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
