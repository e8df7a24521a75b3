"""What one run's parts share (``RunScope``), and what a caller may set for one run
(``RunOverrides``).

A run (``run.Run``) is made of parts: its conversation (``compaction``), its root turns
(``root_turns``), its code runs (``code_runs``), the REPL's helpers (``subcalls``) and
what the model is told (``prompts``). Each part is given the run's scope, not a list of
values and callbacks: the settings read once when the run starts, the client, the run
tree (ledger, budgets, the counts the status panel reads), the result being filled in,
the run's depth, the time by which its calls must end, and its REPL once open. What the
status panel is told goes through the scope too (``status``), so no part needs the run.

``RunOverrides`` is ``RLM.arun``'s list of keywords, written once: ``RLM.start`` and
``Run`` take it, and a test holds ``arun``'s explicit signature (kept for IDE help) to
it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any

from ..errors import ConfigError
from ..llm.redaction import redact_messages
from ..llm.usage import UsageLedger
from ..repl import backends
from ..repl.backends import Backend
from ..repl.base import SandboxSettings
from .result import RLMResult
from .tree import RunTree

if TYPE_CHECKING:
    from ..config import RLMConfig
    from ..llm.client import LLMClient
    from ..repl.base import REPL
    from .session import RLMSession


@dataclass(frozen=True)
class RunOverrides:
    """What a caller may set for one run over its ``RLM``'s settings (None: the RLM's).

    ``session``: an ``RLMSession``, or (for ``RLM.start`` and ``RLM.arun``) the name of
    one of the RLM's. ``namespace``: a dict the REPL runs in (``--live``): never
    sandboxed. ``sandbox``: a backend's name (``repl.backends``), or "auto"."""

    model: str | None = None
    sub_model: str | None = None
    max_iterations: int | None = None
    max_depth: int | None = None
    namespace: dict[str, Any] | None = None
    sandbox: str | None = None
    session: RLMSession | str | None = None

    @classmethod
    def picked(cls, keywords: Mapping[str, Any]) -> RunOverrides:
        """The overrides among ``keywords`` (``arun``'s ``locals()``); others ignored."""
        return cls(**{field.name: keywords[field.name] for field in fields(cls)})

    def kept_session(self) -> RLMSession | None:
        """The session to carry on in; a name must have been looked up by ``RLM.start``."""
        if self.session is not None and self.namespace is not None:
            raise ConfigError(
                "a session keeps a REPL of its own: it cannot run in the "
                "notebook's namespace (--live)"
            )
        if isinstance(self.session, str):
            raise ConfigError(
                f"session {self.session!r} is a name: start the run with RLM.start or "
                "RLM.arun, which look it up, or pass the RLMSession"
            )
        return self.session


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
    sandbox: Backend  # where model code runs
    early_execution: bool
    compact_at: float

    @classmethod
    def read(cls, config: RLMConfig, overrides: RunOverrides) -> RunSettings:
        """``config``'s settings now, with ``overrides`` over them."""
        given = overrides
        return cls(
            model=given.model or config.model,
            sub_model=given.sub_model or config.effective_sub_model,
            max_iterations=(
                given.max_iterations if given.max_iterations is not None else config.max_iterations
            ),
            max_depth=given.max_depth if given.max_depth is not None else config.max_depth,
            step_timeout=config.step_timeout,
            max_output_chars=config.max_output_chars,
            max_tokens=config.max_tokens,
            sandbox=where_code_runs(
                given.sandbox, config.sandbox, given.namespace, given.kept_session()
            ),
            early_execution=config.early_execution and config.stream,
            compact_at=config.compact_at,
        )

    def for_child(self) -> RunOverrides:
        """A child run's (``rlm_query``): the sub-model as its root, the same limits."""
        return RunOverrides(
            model=self.sub_model,
            sub_model=self.sub_model,
            max_iterations=self.max_iterations,
            max_depth=self.max_depth,
            sandbox=self.sandbox.name,
        )


@dataclass(eq=False)
class RunScope:
    """What the parts of one run share. ``config``: the ``RLM`` it runs for (read live
    only for what may change while it runs: ``max_concurrency``); ``deadline``: a child
    run's, by which its parent's step must end; ``step_deadline``: the current step's,
    set by ``code_runs`` while a block runs; ``repl``: the run's REPL, once open."""

    config: RLMConfig
    client: LLMClient
    settings: RunSettings
    tree: RunTree
    result: RLMResult
    depth: int = 0
    deadline: float | None = None
    step_deadline: float | None = None
    repl: REPL | None = None

    @classmethod
    def of(
        cls,
        config: RLMConfig,
        client: LLMClient,
        query: str,
        overrides: RunOverrides,
        within: RunTree | RunScope | None = None,
    ) -> RunScope:
        """The scope of a run of ``query``. ``within``: None for a new run tree; a tree
        of the caller's (an evaluation's, whose ledger is its item's); or the scope of
        the run whose child this is (its tree, one level deeper, within its step)."""
        settings = RunSettings.read(config, overrides)
        depth, deadline = 0, None
        if isinstance(within, RunScope):
            depth, deadline, tree = within.depth + 1, within.calls_end_by, within.tree
        elif within is not None:
            tree = within
        else:
            tree = RunTree(
                UsageLedger(parent=client.ledger),
                config.max_sub_calls,
                config.max_cost_usd,
                max_child_sandboxes=config.sandbox_max_children,
            )
        result = RLMResult(
            query=query,
            model=settings.model,
            sub_model=settings.sub_model,
            depth=depth,
            sandbox=settings.sandbox.name,
        )
        chosen = backends.said_once()  # the first run after RLM.sandbox='auto' chose
        if chosen:
            result.notes.append(chosen)
        return cls(config, client, settings, tree, result, depth, deadline)

    @property
    def ledger(self) -> UsageLedger:
        """Where the run's calls (and its children's) are recorded: the tree's."""
        return self.tree.ledger

    @property
    def calls_end_by(self) -> float | None:
        """``time.monotonic()`` by which calls must end: the current step's deadline,
        else the one the run inherited, else None."""
        return self.step_deadline or self.deadline

    def max_concurrency(self) -> int:
        """Child runs at once (``RLM.max_concurrency``, read live: a limiter's limit)."""
        return self.config.max_concurrency

    def sandbox_settings(self) -> SandboxSettings:
        """The sandbox's settings: a child run's share its tree's child sandboxes."""
        settings = SandboxSettings.from_config(self.config)
        if self.depth == 0:
            return settings
        return settings.for_child(self.tree.max_child_sandboxes)

    def status(self, phase: str, iteration: int | None = None) -> None:
        """What the status panel shows of a root run ("thinking", "running code",
        "compacting"); a child run's phases are not shown."""
        if self.depth == 0:
            self.tree.phase = phase
            if iteration is not None:
                self.tree.iteration = iteration
                self.tree.max_iterations = self.settings.max_iterations

    async def share_history(self, history: list[dict[str, Any]]) -> None:
        """The whole conversation as the REPL variable ``history``, redacted as all that
        the model's code can see is (the sandbox's code must not read a secret either)."""
        shared = await redact_messages([dict(m) for m in history], self.client.redactor())
        if self.repl is not None:
            await self.repl.set_variable("history", shared)


def where_code_runs(
    asked: str | None, configured: str, namespace: dict[str, Any] | None, session: RLMSession | None
) -> Backend:
    """The backend model code runs on: never sandboxed in the notebook's namespace; a
    session's REPL runs where it began."""
    if session is not None:
        if asked is not None and backends.named(asked) is not session.sandbox:
            raise ConfigError(
                f"session {session.name!r} runs its code {session.sandbox.where}; it "
                f"cannot switch to sandbox={asked!r}"
            )
        return session.sandbox  # the REPL it keeps
    if namespace is not None:
        return backends.NONE
    try:
        return backends.named(asked or configured)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
