"""``RLM``: the settings users set (``%config RLM.model = ...``) and the runner of runs.

``RLM`` is the traitlets configurable (``RLMConfig``'s traits, under the name users
address) and what a run starts from: ``await RLM(...).arun(query, context=...)``. It owns
what all its runs share (the client: one concurrency limit, one ledger, under the
kernel's: ``session_budget``) and its named sessions; each ``arun`` builds a ``Run``
(``run``) holding that run's state.
"""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

from ..config import RLMConfig
from ..errors import ConfigError
from ..llm.client import LLMClient
from ..llm.transports import close_loop_clients
from ..llm.usage import UsageLedger, UsageSummary
from .result import RLMResult
from .run import Run
from .scope import RunOverrides
from .session import RLMSession
from .session_budget import hold_session_budget, kernel_ledger


class RLM(RLMConfig):
    """Recursive Language Model runner and the ``RLM`` settings of rlm-magic."""

    def __init__(self, *, ledger: UsageLedger | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._client: LLMClient | None = None
        # Where its calls are counted: by default a ledger of its own under the kernel's,
        # so its session budget counts what every RLM of the kernel spent
        # (``session_budget``); the extension's outlives a %reload_ext.
        self._ledger = ledger
        self.sessions: dict[str, RLMSession] = {}

    @property
    def client(self) -> LLMClient:
        """The client all calls of this RLM go through (one limit, one ledger)."""
        if self._client is None:
            ledger = self._ledger
            if ledger is None:
                ledger = UsageLedger(parent=kernel_ledger())

            # Read at each call: a %config of RLM.max_session_cost_usd holds from the next.
            def limit() -> float | None:
                return self.max_session_cost_usd

            hold_session_budget(ledger, limit)
            self._client = LLMClient(self, ledger)
        return self._client

    def usage(self) -> UsageSummary:
        """Usage of every call made through this RLM."""
        return self.client.ledger.summary()

    def session(self, name: str = "session", sandbox: str | None = None) -> RLMSession:
        """The session called ``name``, started on first use."""
        existing = self.sessions.get(name)
        if existing is None or existing.closed:
            existing = self.sessions[name] = RLMSession(self, name, sandbox)
        return existing

    async def forget(self, name: str) -> bool:
        """End the session ``name`` (its sandbox process too); False if there is none."""
        session = self.sessions.pop(name, None)
        if session is None:
            return False
        await session.aclose()
        return True

    def start(self, query: str, context: Any = None, **overrides: Any) -> Run:
        """A run, not yet started: ``await run.execute()``; ``run.result`` is kept up
        to date, so a caller still has the partial result after an interrupt.
        ``overrides``: ``arun``'s keywords (``RunOverrides``); ``session``: an
        ``RLMSession``, or the name of one of this RLM's."""
        return self._start(query, context, RunOverrides(**overrides))

    def _start(self, query: str, context: Any, overrides: RunOverrides) -> Run:
        if isinstance(overrides.session, str):
            session = self.session(overrides.session, overrides.sandbox)
            overrides = dataclasses.replace(overrides, session=session)
        return Run(self, self.client, query, context, overrides)

    async def arun(
        self,
        query: str,
        context: Any = None,
        *,
        model: str | None = None,
        sub_model: str | None = None,
        max_iterations: int | None = None,
        max_depth: int | None = None,
        namespace: dict[str, Any] | None = None,
        sandbox: str | None = None,
        session: RLMSession | str | None = None,
    ) -> RLMResult:
        """Answer ``query`` about ``context``; returns an ``RLMResult`` (check ``.success``).

        ``session``: an ``RLMSession`` (or the name of one of this RLM's) to carry on
        in: its REPL variables, contexts and earlier answers are there for this question.

        ``namespace``: run the REPL in this dict instead of a fresh one (what ``--live``
        does with the notebook's namespace); such a run is never sandboxed.
        ``sandbox``: a backend's name ("process", "wasm", "none") or "auto" for this
        run (default: ``RLM.sandbox``).
        """
        # The keywords are ``RunOverrides``' fields, spelt out for IDE help (a test holds
        # the two lists to each other).
        overrides = RunOverrides.picked(locals())
        return await self._start(query, context, overrides).execute()

    async def _run_and_close(self, query: str, context: Any, **overrides: Any) -> RLMResult:
        try:
            return await self.arun(query, context, **overrides)
        finally:
            await close_loop_clients()  # this loop ends with the run: so do its connections

    def run(self, query: str, context: Any = None, **overrides: Any) -> RLMResult:
        """Blocking ``arun``, for scripts. In a notebook, ``await rlm.arun(...)``."""
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            if overrides.get("session") is not None:
                raise ConfigError(
                    "RLM.run() cannot carry a session: each call runs on an event loop of "
                    "its own, and a session's REPL lives on one; use `await rlm.arun(..., "
                    "session=...)`, e.g. inside one asyncio.run for all the questions"
                ) from None
            return asyncio.run(self._run_and_close(query, context, **overrides))
        raise RuntimeError(
            "RLM.run() cannot be used inside a running event loop (such as "
            "a notebook cell): use `await rlm.arun(...)` instead"
        )
