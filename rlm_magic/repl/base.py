"""What a run needs of a REPL, typed: the ``REPL`` interface both REPLs implement
(``AsyncREPL`` in threads of this kernel, ``SandboxREPL`` in a sandbox of any backend),
what each adds for a run's workspace and a session (``IsolatedREPL``, ``KeptREPL``),
and ``SandboxSettings``, the plain values a sandbox runs with.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Protocol

from .provenance import Replayed
from .steps import StepOutput

if TYPE_CHECKING:
    from ..config import RLMConfig
    from .carried import Carried

# The helpers model code calls, by name: coroutine functions served on the kernel's loop.
Helpers = dict[str, Callable[..., Coroutine[Any, Any, Any]]]


class SubCallBudget(Protocol):
    """A run's sub-call budget, as a REPL sees it: a batch larger than what is left is
    cut before the kernel expands it (the run's ``tree.RunTree``)."""

    max_sub_calls: int

    def sub_calls_left(self) -> int: ...


class REPL(Protocol):
    """A namespace that lives for a run (or a session's runs) and runs blocks in it.

    The readers are async because a sandbox has to ask its process."""

    # The running or last block; after a cancelled ``run``, what is known of it.
    last_output: StepOutput | None
    # The isolation layers in force (``result.isolation``); None where no sandbox is.
    isolation: dict[str, Any] | None
    network_isolated: bool | None

    async def run(self, code: str, timeout: float | None = None) -> StepOutput:
        """Run one block; never raises for errors in the code itself. If cancelled, it
        stops the block and re-raises."""
        ...

    async def final_var(self, name: str) -> str | None:
        """What ``FINAL_VAR(name)`` answers, or None when there is no such variable."""
        ...

    async def replay(
        self,
        codes: Sequence[str],
        variable: str | None = None,
        timeout: float = 10.0,
        answer: str | None = None,
    ) -> Replayed:
        """Run a reply's blocks ``codes`` again with every piece of data changed
        (``provenance``): per world, the digest of its answer (the last block's finish,
        or ``variable``'s value), and whether the code read data; the worlds stop once
        ``answer`` (the real answer's digest) is settled. Within ``timeout`` seconds;
        nothing it does reaches the namespace or the kernel."""
        ...

    async def set_variable(self, name: str, value: Any) -> None: ...

    async def still_carried(self) -> dict[str, str | None]:
        """The variables that still hold what an earlier question of a session left,
        each with the digest its text answers by (``provenance.carried_digests``)."""
        ...

    async def variable_names(self) -> list[str]:
        """The names of the variables the model made."""
        ...

    async def variables(self, timeout: float = 5.0) -> dict[str, Any]:
        """The model's variables (``result.variables``); none if they do not come
        within ``timeout`` seconds."""
        ...

    async def aclose(self) -> None: ...

    def close(self) -> None:
        """``aclose`` without a loop to wait on (the kernel is shutting down)."""
        ...


class IsolatedREPL(REPL, Protocol):
    """A REPL in a sandbox of its own, whichever backend's: started before its first
    use (while the root model thinks), and, for a session's next question, its
    variables carried out as plain data (the next question runs in a fresh sandbox)."""

    # The carried variables could not be loaded safely: the session drops them.
    carried_refused: bool

    async def start(self) -> None: ...

    async def carry_out(self) -> Carried: ...


class KeptREPL(REPL, Protocol):
    """A REPL in this kernel that a session keeps from question to question."""

    def rebind(self, helpers: Helpers, budget: SubCallBudget) -> None:
        """Serve the next run's helpers, to its budget."""
        ...

    def mark_carried(self) -> None:
        """What the namespace holds now is earlier questions' data."""
        ...

    async def set_context(self, value: Any, names: list[str]) -> None: ...


@dataclass(frozen=True)
class SandboxSettings:
    """The settings a sandbox runs with, read once when its REPL is made."""

    memory_mb: int | None = 4096  # address space, per process; None: no limit
    disk_mb: int = 512  # the working folder's size (a tmpfs)
    max_processes: int = 128  # processes and threads at once
    env_names: tuple[str, ...] = ()  # environment variables it may see besides the allowed
    require_isolation: bool = False  # refuse to start unless every required layer holds

    @classmethod
    def from_config(cls, config: RLMConfig) -> SandboxSettings:
        """The ``RLM.sandbox_*`` settings as they are now."""
        return cls(
            memory_mb=config.sandbox_memory_mb,
            disk_mb=config.sandbox_disk_mb,
            max_processes=config.sandbox_max_processes,
            env_names=tuple(config.sandbox_env or ()),
            require_isolation=bool(config.sandbox_require_isolation),
        )

    def for_child(self, siblings: int) -> SandboxSettings:
        """A child run's share, one of ``siblings`` that may run at once: together they
        hold no more processes and disk than this sandbox may."""
        return replace(
            self,
            max_processes=max(8, self.max_processes // siblings),
            disk_mb=max(1, self.disk_mb // siblings),
        )
