"""Loading and unloading the extension into an IPython shell.

Loading twice is harmless; unloading removes exactly what loading added and leaves
any user variable that has since replaced a helper alone.
"""

from __future__ import annotations

import types

from ..llm.usage import UsageLedger
from ..rlm.runner import RLM
from ..rlm.session_budget import kernel_ledger
from . import interrupts
from .helpers import HELPER_CODES, NotebookHelpers
from .magics import RLMMagics, transform_rlm_cell

_STATE_ATTR = "_rlm_magic_state"
_LEDGER_ATTR = "_rlm_magic_ledger"  # (not removed by unload: see _notebook_ledger)


class _State:
    def __init__(self, rlm, magics, helpers):
        self.rlm = rlm
        self.magics = magics
        self.helpers = helpers


def session_rlm(shell) -> RLM | None:
    """The ``RLM`` that ``%config RLM...`` configures in this shell, if loaded."""
    state = getattr(shell, _STATE_ATTR, None)
    return state.rlm if state else None


def _notebook_ledger(shell) -> UsageLedger:
    """The ledger of the notebook's RLM, under the kernel's (whose spend every RLM's
    session budget counts: ``rlm.session_budget``). Kept on the shell: a ``%reload_ext
    rlm_magic`` builds a new RLM, whose ``usage()`` and session budget go on with what
    the last one spent and holds."""
    ledger = getattr(shell, _LEDGER_ATTR, None)
    if ledger is None:
        ledger = UsageLedger(parent=kernel_ledger())
        setattr(shell, _LEDGER_ATTR, ledger)
    return ledger


def load(shell) -> None:
    if getattr(shell, _STATE_ATTR, None) is not None:
        return
    # (picks up c.RLM.* from ipython_config.py)
    rlm = RLM(parent=shell, ledger=_notebook_ledger(shell))
    shell.configurables.append(rlm)
    magics = RLMMagics(shell, rlm)
    shell.register_magics(magics)
    if transform_rlm_cell not in shell.input_transformers_cleanup:
        shell.input_transformers_cleanup.append(transform_rlm_cell)
    helpers = NotebookHelpers(rlm).namespace()  # the notebook's side: built here
    shell.push(helpers)
    shell.user_ns_hidden.update(helpers)  # keep them out of %who
    plain = shell.display_formatter.formatters["text/plain"]
    plain.for_type(types.CoroutineType, _coroutine_hint)
    shell.events.register("pre_run_cell", interrupts.cell_started)
    shell.events.register("post_run_cell", interrupts.cell_ended)
    setattr(shell, _STATE_ATTR, _State(rlm, magics, helpers))


def unload(shell) -> None:
    state = getattr(shell, _STATE_ATTR, None)
    if state is None:
        return
    for session in list(state.rlm.sessions.values()):
        session.close_soon()  # their sandbox processes end with the extension
    state.rlm.sessions.clear()
    for name, helper in state.helpers.items():
        if shell.user_ns.get(name) is helper:
            del shell.user_ns[name]
        shell.user_ns_hidden.pop(name, None)
    if transform_rlm_cell in shell.input_transformers_cleanup:
        shell.input_transformers_cleanup.remove(transform_rlm_cell)
    for kind, name in (("line", "rlm"), ("cell", "rlm"), ("cell", "llm")):
        registered = shell.magics_manager.magics[kind].get(name)
        if getattr(registered, "__self__", None) is state.magics:
            del shell.magics_manager.magics[kind][name]
    shell.magics_manager.registry.pop("RLMMagics", None)
    if state.rlm in shell.configurables:
        shell.configurables.remove(state.rlm)
    plain = shell.display_formatter.formatters["text/plain"]
    plain.type_printers.pop(types.CoroutineType, None)
    for event, hook in (
        ("pre_run_cell", interrupts.cell_started),
        ("post_run_cell", interrupts.cell_ended),
    ):
        if hook in shell.events.callbacks[event]:
            shell.events.unregister(event, hook)
    delattr(shell, _STATE_ATTR)


def _coroutine_hint(coro, printer, cycle) -> None:
    """A helper called without ``await`` shows how to fix it, not a coroutine repr."""
    name = HELPER_CODES.get(getattr(coro, "cr_code", None))
    if name is None or getattr(coro, "cr_frame", None) is None:
        printer.text(repr(coro))
        return
    coro.close()  # it will never run: close it, so Python does not warn "never awaited"
    printer.text(f"<{name}(...) was not run: add `await`, as in `result = await {name}(...)`>")
