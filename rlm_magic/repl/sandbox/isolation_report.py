"""What the kernel makes of a worker's isolation report: ``result.isolation``, a
warning (once per kernel) for a layer the OS refused, and a refusal to go on if full
isolation is required. The worker reports before any model code runs, so the report
is its own.
"""

from __future__ import annotations

import sys
import warnings
from typing import Any

from ...errors import SandboxError
from .. import bridge

_warned_isolation = False
# What to do where the OS refuses layers.
if sys.platform.startswith("linux"):
    _REMEDY = (
        "allow unprivileged user namespaces (sysctl "
        "kernel.unprivileged_userns_clone=1; on Ubuntu 24.04 "
        "kernel.apparmor_restrict_unprivileged_userns=0, or an AppArmor profile for "
        "python); in Docker, run with --security-opt seccomp=unconfined or give the "
        "kernel its own VM"
    )
else:
    _REMEDY = "run the kernel on Linux (a VM or a container) for them"


def read_isolation(report: Any, layers_known: tuple[str, ...]) -> dict[str, Any]:
    """The report as ``result.isolation``: each of the backend's ``layers_known`` with
    its flag, and short notes."""
    layers = report.get("layers") if isinstance(report, dict) else None
    notes = report.get("notes") if isinstance(report, dict) else None
    if not isinstance(layers, dict) or not isinstance(notes, dict):
        raise bridge.BridgeError("a 'ready' message without an isolation report")
    flags = {name: layers.get(name) is True for name in layers_known}
    notes = {str(k): str(v)[:300] for k, v in notes.items() if k in layers_known}
    return {**flags, "notes": notes}


def insist_on_isolation(
    found: dict[str, Any], layers_required: tuple[str, ...], required: bool
) -> None:
    """Raise ``SandboxError`` if a required layer is missing and ``required`` is set
    (RLM.sandbox_require_isolation); otherwise warn, once."""
    missing = [name for name in layers_required if not found[name]]
    if not missing:
        return
    notes = found["notes"]
    why = "; ".join(f"{name}: {notes.get(name, 'refused')}" for name in missing)
    if required:
        raise SandboxError(
            f"the sandbox is not fully isolated here ({why}); "
            f"RLM.sandbox_require_isolation is set, so the run does not "
            f"start. Remedy: {_REMEDY}"
        )
    _warn_isolation_once(
        f"the RLM sandbox runs without {', '.join(missing)} "
        f"isolation here ({why}); result.isolation says so. To fix: "
        f"{_REMEDY}"
    )


def _warn_isolation_once(message: str) -> None:
    global _warned_isolation
    if not _warned_isolation:
        _warned_isolation = True
        warnings.warn(message, RuntimeWarning, stacklevel=3)
