"""The REPL a run's code runs in, from its making to its closing.

Where the model's code runs is decided once per run, with its settings
(``scope.where_code_runs``):

- in a sandbox (``RLM.sandbox``: a backend of ``repl.backends`` that isolates, such as
  ``"process"`` or ``"wasm"``), whose launcher starts it;
- in threads of this kernel (``"none"``), in a fresh namespace;
- in the notebook's own namespace (``--live``): never sandboxed, and every name the run
  put there is taken out again at its end (the notebook's own values put back);
- in a session's REPL (``--session``): a new context joins the earlier ones as
  ``context_N`` and becomes ``context``. Sandboxed, each question gets a fresh process
  with the session's contexts and its variables carried over as plain data
  (``repl/carried.py``); in this kernel, one namespace serves every question.

Whatever ends the run, closing keeps the model's variables (``result.variables``:
answers already paid for stay reachable) and what isolation held.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from ..repl.base import REPL, Helpers, IsolatedREPL
from ..repl.bridge import BridgeError
from ..repl.carried import SessionStart
from ..repl.inprocess import AsyncREPL
from ..repl.namespace import FINISHERS
from ..repl.sandbox import SandboxError, SandboxREPL, pickled_context
from ..repl.sandbox.process import launch as launch_process
from ..repl.steps import preloaded, repl_builtins
from .result import RLMResult
from .session import RLMSession

if TYPE_CHECKING:
    from .scope import RunScope

# Names a run puts into a live namespace besides the context and helpers.
INTERRUPTED_WAIT_S = 0.5  # for the variables of an interrupted run
_SCAFFOLD = ("__rlm_async__", "__rlm_print_final__", "history")


class Workspace:
    """One run's REPL: ``await open()``, then ``repl``; ``await close(result)`` at the end."""

    def __init__(
        self,
        scope: RunScope,
        context: Any,
        helpers: Helpers,
        namespace: dict[str, Any] | None = None,
        session: RLMSession | None = None,
    ):
        self.context = context  # a session's latest, once open, when the run gave none
        self.helpers = helpers
        self.sandbox = scope.settings.sandbox
        self.settings = scope.sandbox_settings()
        self.secrets = tuple(scope.config.configured_secrets())
        self.max_output_chars = scope.settings.max_output_chars
        self.budget = scope.tree  # the run's sub-calls: a sandbox cuts batches to it early
        self.session = session
        self.live = namespace is not None
        self.namespace = (
            namespace
            if namespace is not None
            else {"__name__": "__rlm__", "__builtins__": repl_builtins()}
        )
        self.repl: REPL | None = None
        self.isolated: IsolatedREPL | None = None  # the same REPL, when in a sandbox
        self._preexisting = set(self.namespace) if self.live else set()  # the notebook's
        self._touched: list[str] = []
        self._saved: dict[str, Any] = {}

    async def open(self) -> REPL:
        namespace = self.namespace
        injected = preloaded(namespace, self.context)
        self._touched = [*injected, *self.helpers, *FINISHERS, *_SCAFFOLD]
        if self.live:
            self._saved = {name: namespace[name] for name in self._touched if name in namespace}
        if self.session is not None:
            await self._session_repl(self.session, injected)
        elif self.sandbox.isolated:
            self.repl = self._sandbox_repl(self.context)
            await self.repl.start()  # the process starts while the root model thinks
        else:
            namespace.update(injected)
            self.repl = AsyncREPL(namespace, self.helpers)
        assert self.repl is not None
        return self.repl

    def _sandbox_repl(
        self,
        context: Any,
        context_names: tuple[str, ...] = (),
        pickled: bytes | None = None,
        session: SessionStart | None = None,
    ) -> IsolatedREPL:
        self.isolated = SandboxREPL(
            context,
            self.helpers,
            max_output_chars=self.max_output_chars,
            secrets=self.secrets,
            context_names=context_names,
            settings=self.settings,
            budget=self.budget,
            pickled=pickled,
            session=session,
            launcher=self.sandbox.launcher or launch_process,
        )
        return self.isolated

    async def _session_repl(self, session: RLMSession, injected: dict[str, Any]) -> None:
        """The session's REPL: a new context joins the earlier ones as context_N and
        becomes `context`. In a sandbox, a fresh process for each question (code from an
        earlier question must not decide this one's answer), holding the session's
        contexts and the variables carried from its last question as plain data; in
        this kernel, one namespace kept from the first question on."""
        fresh = self.context is not None
        context = self.context if fresh else session.context
        names = [session.context_name(), "context"] if fresh else []
        pickled = None  # sandboxed: the context as the kernel pickled it
        if self.sandbox.isolated:
            earlier = list(session.pickles)  # the kernel's own pickles of its contexts
            pickled = await pickled_context(context) if fresh else None
            if not fresh and earlier:
                pickled = earlier.pop()  # the latest context stays `context`
            latest = (f"context_{len(earlier)}",) if pickled is not None else ()
            self.repl = repl = self._sandbox_repl(
                context,
                latest,
                pickled=pickled,
                session=SessionStart(
                    session.carried,
                    tuple((f"context_{n}", p) for n, p in enumerate(earlier)),
                ),
            )
            await repl.start()  # the process starts while the root model thinks
        elif session.repl is None:
            self.namespace.update(injected)
            self.namespace.update(dict.fromkeys(names, context))
            self.repl = AsyncREPL(self.namespace, self.helpers)
            session.keep(self.repl, self.namespace)
        else:
            self.repl = session.repl
            self.repl.rebind(self.helpers, self.budget)
            self.repl.mark_carried()  # what the namespace holds now is earlier questions' data
            await self.repl.set_variable("answer", {"content": "", "ready": False})
            if names:
                await self.repl.set_context(context, names)
        if fresh:  # only once the REPL has it: a failed delivery leaves the session as it was
            session.add_context(context, pickled)
        self.context = context

    async def close(self, result: RLMResult) -> None:
        """Close the REPL, keeping the model's variables whatever ended the run: answers
        already paid for stay reachable as result.variables. A session's REPL stays
        open for its next question. A live namespace gets back what it held."""
        try:
            if self.repl is not None:
                await self._close_repl(self.repl, result)
        finally:
            if self.live:
                for name in self._touched:
                    self.namespace.pop(name, None)
                self.namespace.update(self._saved)

    async def _close_repl(self, repl: REPL, result: RLMResult) -> None:
        result.network_isolated = repl.network_isolated
        result.isolation = repl.isolation
        # An interrupt ends the cell within a second whatever the sandbox does: its
        # variables and a session's carried ones must come by then (they take
        # milliseconds; a sandbox whose bridge thread is wedged would take the timeouts).
        interrupted = result.stop_reason == "interrupted"
        try:
            variables = await repl.variables(timeout=INTERRUPTED_WAIT_S if interrupted else 5.0)
            result.variables = {
                name: value for name, value in variables.items() if name not in self._preexisting
            }
            if self.session is not None and self.isolated is not None:
                try:
                    await asyncio.wait_for(
                        self._carry(self.session, self.isolated, result),
                        INTERRUPTED_WAIT_S if interrupted else None,
                    )
                except asyncio.TimeoutError:
                    result.notes.append(
                        "the session keeps its variables from before this question: they "
                        f"did not come within {INTERRUPTED_WAIT_S:g}s of the interrupt"
                    )
        finally:
            if self.session is None or self.session.repl is not repl:
                await repl.aclose()  # stopped steps may send nothing more

    @staticmethod
    async def _carry(session: RLMSession, repl: IsolatedREPL, result: RLMResult) -> None:
        """Keep the model's variables, as plain data, for the session's next question;
        if the sandbox cannot give them, the session keeps those it had."""
        if repl.carried_refused:  # the run failed saying so; the next starts clean
            session.carry(None)
            return
        try:
            session.carry(await repl.carry_out())
        except (SandboxError, BridgeError, asyncio.TimeoutError) as exc:
            result.notes.append(f"the session keeps its variables from before this question: {exc}")
