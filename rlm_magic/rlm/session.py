"""Sessions: a follow-up question carries on where the last one ended.

An ``RLMSession`` keeps, between runs, the model's variables, every context it was given
(``context_0``, ``context_1``, ... with ``context`` the latest, as the official RLM
library names them) and a short memory of the earlier questions and answers, which the
next question's first message carries. In this kernel (``sandbox="none"``) the variables
live on in one namespace. Sandboxed, each question runs in a fresh process, and the
variables that are plain data are carried to it (``repl/carried.py``): code from an
earlier question, such as a poisoned document's, cannot reach the code that decides a
later answer. A failed or interrupted run leaves the session as it was, its variables
included.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from .._tables import html_table, text_table
from ..errors import ConfigError
from ..llm.usage import format_cost
from ..repl import backends
from ..repl.backends import Backend

if TYPE_CHECKING:
    from ..repl.base import KeptREPL
    from ..repl.carried import Carried
    from .result import RLMResult


class Answerer(Protocol):
    """What a session asks its questions of: an ``RLM``."""

    sandbox: str

    # A session only forwards its caller's keywords, so the RLM's signature is not repeated.
    @property
    def arun(self) -> Callable[..., Awaitable[RLMResult]]: ...


# The memory shown to the next question: the latest questions in full, their answers
# cut to this many characters (the variables keep everything).
MEMORY_QUESTIONS = 8
MEMORY_ANSWER_CHARS = 1_500


@dataclass
class Exchange:
    question: str
    answer: str | None
    outcome: str  # the run's stop_reason


class RLMSession:
    """A REPL and a memory shared by a series of questions.

    ``await session.arun(question, context=...)`` (or ``rlm.arun(..., session=session)``);
    ``await session.aclose()`` ends it (its sandbox process too)."""

    def __init__(self, rlm: Answerer, name: str = "session", sandbox: str | None = None):
        self.rlm = rlm
        self.name = name
        try:  # decided once: every question runs where the first did
            self.sandbox: Backend = backends.named(sandbox or rlm.sandbox)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        # In this kernel: the REPL made by the first run, kept open between runs.
        self.repl: KeptREPL | None = None
        self.namespace: dict[str, Any] | None = None
        # Sandboxed: the variables the last question left, as plain data for the next.
        self.carried: Carried | None = None
        self.contexts: list[Any] = []
        self.pickles: list[bytes] = []  # sandboxed: the contexts as the kernel pickled them
        self.exchanges: list[Exchange] = []
        self.results: list[RLMResult] = []
        self.variable_names: list[str] = []
        # The question (from 1) each kept variable first came from: its values are data
        # of that question's context, never a later question's answer.
        self.origins: dict[str, int] = {}
        self.closed = False
        self.loop: asyncio.AbstractEventLoop | None = None  # where its REPL lives
        self._busy = asyncio.Lock()

    async def arun(self, query: str, context: Any = None, **overrides: Any) -> RLMResult:
        """Ask the next question of this session."""
        return await self.rlm.arun(query, context, session=self, **overrides)

    # -- what a run of the session uses -----------------------------------------------------
    @property
    def context(self) -> Any:
        """The latest context given, or None."""
        return self.contexts[-1] if self.contexts else None

    @asynccontextmanager
    async def answering(self, result: RLMResult) -> AsyncIterator[None]:
        """Hold the session for one question: on its loop, one question at a time, and
        the question's ``result`` recorded however its run ends (failed and interrupted
        runs too)."""
        self.claim(asyncio.get_running_loop())
        async with self._busy:
            try:
                yield
            finally:
                self.record(result)

    def keep(self, repl: KeptREPL, namespace: dict[str, Any] | None = None) -> None:
        """Keep the in-process REPL a run made, and its namespace, for the next ones."""
        self.repl, self.namespace = repl, namespace

    def context_name(self) -> str:
        """The name the next context takes besides ``context``: ``context_N``."""
        return f"context_{len(self.contexts)}"

    def add_context(self, context: Any, pickled: bytes | None = None) -> None:
        """A context the REPL now holds (only once it does: a failed delivery leaves the
        session as it was); sandboxed, with its pickle for the next questions' sandboxes."""
        self.contexts.append(context)
        if pickled is not None:
            self.pickles.append(pickled)

    def carry(self, carried: Carried | None) -> None:
        """The variables a sandboxed question left, for the next one (None: none)."""
        self.carried = carried
        self.variable_names = list(carried.names) if carried is not None else []
        self._note_origins(len(self.exchanges) + 1)  # carried as its question closes

    def claim(self, loop: asyncio.AbstractEventLoop) -> None:
        if self.closed:
            raise ConfigError(f"session {self.name!r} was closed; start a new one")
        if self.loop is not None and self.loop is not loop:
            raise ConfigError(
                f"session {self.name!r} lives on another event loop (its REPL "
                "and lock belong to it); ask its questions on one loop"
            )
        self.loop = loop
        if self._busy.locked():
            raise ConfigError(
                f"session {self.name!r} is answering another question; wait for it to finish"
            )

    def memory(self) -> str:
        """The earlier questions and answers, for the next question's first message."""
        if not self.exchanges:
            return ""
        shown = self.exchanges[-MEMORY_QUESTIONS:]
        lines = [
            "Earlier questions in this session (your REPL variables from them are "
            "still there: reuse them as data rather than asking sub-models again):"
        ]
        if len(self.exchanges) > len(shown):
            lines.append(f"({len(self.exchanges) - len(shown)} earlier questions left out)")
        for number, exchange in enumerate(shown, len(self.exchanges) - len(shown) + 1):
            answer = exchange.answer if exchange.answer is not None else "(no answer)"
            if len(answer) > MEMORY_ANSWER_CHARS:
                answer = answer[:MEMORY_ANSWER_CHARS] + " ... [cut]"
            ended = "" if exchange.outcome == "final" else f" (the run ended: {exchange.outcome})"
            lines.append(f"Q{number}: {exchange.question}\nA{number}{ended}: {answer}")
        if self.variable_names:
            kept = ", ".join(
                f"{name} (Q{self.origins[name]})" if name in self.origins else name
                for name in self.variable_names[:60]
            )
            lines.append(
                "Variables kept from earlier questions, with the question each came from "
                "(data read from that question's context, not answers to this one): " + kept
            )
        if self.carried is not None and self.carried.left:
            left = ", ".join(f"{name} ({kind})" for name, kind in self.carried.left[:30])
            lines.append(
                "Not kept from earlier questions (each question runs in a fresh sandbox "
                "process, and only plain data crosses: text, numbers, containers, dates; "
                f"files are not kept either): {left}"
            )
        return "\n".join(lines)

    def record(self, result: RLMResult) -> None:
        self.results.append(result)
        self.exchanges.append(
            Exchange(result.query, result.final_answer, result.stop_reason or "error")
        )
        if self.sandbox.isolated:
            return  # the names carried to the next question (``carry``)
        if result.variables or result.stop_reason in ("final", "max_iterations", "budget"):
            self.variable_names = list(result.variables)
            self._note_origins(len(self.exchanges))

    def _note_origins(self, question: int) -> None:
        self.origins = {name: self.origins.get(name, question) for name in self.variable_names}

    # -- what people see ------------------------------------------------------------------
    @property
    def cost_usd(self) -> float | None:
        costs = [r.usage.cost_usd for r in self.results if r.usage.cost_usd is not None]
        return sum(costs) if costs else None

    @property
    def tokens(self) -> int:
        return sum(r.usage.total.total_tokens for r in self.results)

    def summary(self) -> dict[str, Any]:
        return {
            "session": self.name,
            "questions": len(self.exchanges),
            "contexts": len(self.contexts),
            "variables": len(self.variable_names),
            "sandbox": self.sandbox.name,
            "tokens": self.tokens,
            "cost_usd": self.cost_usd,
        }

    def __repr__(self) -> str:
        return (
            f"RLMSession({self.name!r}: {len(self.exchanges)} question(s), "
            f"{len(self.contexts)} context(s), {len(self.variable_names)} variable(s), "
            f"{self.tokens:,} tokens, {format_cost(self.cost_usd)})"
        )

    def close_soon(self) -> None:
        """End the session from synchronous code (``%rlm forget``): its REPL closes on
        the running loop, or at once when no loop runs."""
        self.closed = True
        repl, self.repl, self.namespace, self.carried = self.repl, None, None, None
        if repl is None:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            repl.close()  # no loop to await on: stop its steps, kill its process
            return
        task = loop.create_task(repl.aclose())
        _CLOSING.add(task)  # held until done: the loop keeps only weak references
        task.add_done_callback(_CLOSING.discard)

    async def aclose(self) -> None:
        """End the session: its REPL (and sandbox process) goes."""
        self.closed = True
        repl, self.repl, self.carried = self.repl, None, None
        if repl is not None:
            await repl.aclose()
        self.namespace = None


_CLOSING: set[asyncio.Task[None]] = set()


class SessionsView:
    """``%rlm sessions``: one row per session, with its size and cost."""

    def __init__(self, sessions: list[RLMSession]):
        self.sessions = sessions

    def _rows(self) -> list[tuple[str, ...]]:
        return [
            (
                s.name,
                str(len(s.exchanges)),
                str(len(s.contexts)),
                str(len(s.variable_names)),
                s.sandbox.name,
                f"{s.tokens:,}",
                format_cost(s.cost_usd),
            )
            for s in self.sessions
        ]

    _HEAD = ("session", "questions", "contexts", "variables", "sandbox", "tokens", "cost")

    def __repr__(self) -> str:
        if not self.sessions:
            return "No sessions."
        return text_table(self._HEAD, self._rows())

    def _repr_html_(self) -> str:
        if not self.sessions:
            return "<p>No sessions.</p>"
        return html_table(self._HEAD, self._rows())
