"""Where model code runs: one registry of backend kinds, each a value.

- ``process``: a process of its own, confined by Linux's layers (``repl/isolation``);
- ``wasm``: CPython compiled to WebAssembly in a confined Deno (``wasm.py``), the same
  on Linux, macOS and Windows;
- ``container``: the process worker in a Docker or Podman container (``container.py``):
  no network, a read-only root, cgroup limits, an unprivileged user;
- ``none``: threads of this kernel, in a fresh namespace (no isolation at all);
- ``auto`` (``RLM.sandbox``'s default) is not a backend but a choice of one
  (``chosen``): the strongest that works on this machine, said once in one line.

A backend that isolates gives ``SandboxREPL`` its launcher (how its sandbox process
starts); the REPL, the bridge and the helper calls are shared by all. Adding one is a
module with a launcher and an ``unavailable()`` check, and an entry here.
"""

from __future__ import annotations

import functools
import subprocess
import sys
import tempfile
import warnings
from collections.abc import Callable
from dataclasses import dataclass

from ..sandbox.process import launch as launch_process
from ..sandbox.repl import Launcher

AUTO = "auto"


@dataclass(frozen=True)
class Backend:
    """One place model code can run."""

    name: str
    # Model code runs outside the kernel's process: its REPL is a SandboxREPL.
    isolated: bool
    # How its sandbox process starts (None: model code runs in the kernel's threads).
    launcher: Launcher | None
    # Why it cannot run on this machine, or None (checked when chosen, not at import).
    unavailable: Callable[[], str | None]
    # Where the code runs, in the words a message uses ("in a sandbox process").
    where: str

    def __str__(self) -> str:
        return self.name


def _process_unavailable() -> str | None:
    if sys.platform == "win32":
        return "a sandbox process needs fork and descriptor passing, which Windows lacks"
    return None


def _wasm_unavailable() -> str | None:
    from . import wasm

    return wasm.unavailable()


async def _launch_wasm(*args):  # type: ignore[no-untyped-def]
    from . import wasm  # Deno's side is loaded only when used

    return await wasm.launch(*args)


def _container_unavailable() -> str | None:
    from . import container

    return container.unavailable()


async def _launch_container(*args):  # type: ignore[no-untyped-def]
    from . import container  # a container runtime is asked only when used

    return await container.launch(*args)


PROCESS = Backend("process", True, launch_process, _process_unavailable, "in a sandbox process")
WASM = Backend("wasm", True, _launch_wasm, _wasm_unavailable, "in a WebAssembly sandbox")
CONTAINER = Backend(
    "container", True, _launch_container, _container_unavailable, "in a sandbox container"
)
NONE = Backend("none", False, None, lambda: None, "in this kernel")
BACKENDS: dict[str, Backend] = {
    backend.name: backend for backend in (PROCESS, WASM, CONTAINER, NONE)
}
NAMES = (AUTO, *BACKENDS)


def named(name: str) -> Backend:
    """The backend ``name`` names ("auto": the one ``chosen`` for this machine)."""
    if name == AUTO:
        return chosen()
    try:
        return BACKENDS[name]
    except KeyError:
        raise ValueError(f"sandbox must be one of {', '.join(NAMES)}; got {name!r}") from None


_unsaid: list[str] = []  # what ``auto`` chose, until a run's notes say it


def said_once() -> str | None:
    """The one line saying what ``auto`` chose, the first time it is asked for."""
    return _unsaid.pop() if _unsaid else None


@functools.cache
def chosen() -> Backend:
    """``auto``: the process sandbox where Linux gives it user namespaces; elsewhere the
    wasm sandbox if Deno is installed; else the process sandbox with the layers the OS
    allows (none of Linux's off Linux), or this kernel on Windows, with a warning that
    names what is missing and the one command that adds it. Decided once per kernel."""
    if sys.platform.startswith("linux") and user_namespaces_work():
        _unsaid.append(
            "RLM.sandbox='auto': model code runs in a sandbox process (Linux, user namespaces)"
        )
        return PROCESS
    why = (
        "this Linux refuses user namespaces"
        if sys.platform.startswith("linux")
        else f"{'macOS' if sys.platform == 'darwin' else 'Windows'} has none of Linux's layers"
    )
    if WASM.unavailable() is None:
        _unsaid.append(f"RLM.sandbox='auto': model code runs in a WebAssembly sandbox ({why})")
        return WASM
    from .wasm import INSTALL_DENO

    fallback = PROCESS if PROCESS.unavailable() is None else NONE
    if fallback is NONE:
        missing = "your files, keys and network are reachable from model code"
    elif sys.platform.startswith("linux"):
        missing = (
            "without the user, PID and process-count layers (the syscall filter and "
            "Landlock still hold; processes it starts with setsid may outlive it)"
        )
    else:
        missing = "it runs as your user and can read your files and use the network"
    warnings.warn(  # (a warning, said once: not a note as well)
        f"RLM.sandbox='auto': {why}, so model code runs {fallback.where}, {missing}. "
        f"For a real sandbox here: {INSTALL_DENO}",
        RuntimeWarning,
        stacklevel=2,
    )
    return fallback


# The process sandbox's first layer, tried as it is used: the namespaces it enters in
# one unshare, and a mount in the new mount namespace (Ubuntu 24.04's AppArmor lets an
# unprivileged process make a user namespace but takes its capabilities there, so the
# namespaces after it fail). In a fresh Python: nothing of this kernel's changes.
_PROBE = """
import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
uid, folder = os.getuid(), sys.argv[1]
if libc.unshare(0x10000000 | 0x00020000 | 0x40000000 | 0x20000000 | 0x08000000) != 0:
    sys.exit(1)
try:
    open('/proc/self/setgroups', 'w').write('deny')
    open('/proc/self/uid_map', 'w').write(f'0 {uid} 1')
except OSError:
    sys.exit(1)
sys.exit(0 if libc.mount(b'none', folder.encode(), b'tmpfs', 0, None) == 0 else 1)
"""


def user_namespaces_work() -> bool:
    """Whether a process of this user may enter the namespaces the process sandbox
    uses and mount in them, tried in a fresh Python once."""
    try:
        with tempfile.TemporaryDirectory(prefix="rlm-probe-") as folder:
            probe = [sys.executable, "-I", "-c", _PROBE, folder]
            return subprocess.run(probe, timeout=30, capture_output=True).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False
