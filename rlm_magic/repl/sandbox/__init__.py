"""The sandboxed REPL: model code runs in a process of its own (``worker.py``), and the
helpers it calls are served on the kernel's loop, over the bridge.

``repl`` holds ``SandboxREPL``, the REPL a run uses; ``process`` a sandbox
process's life (start, handshake, frames, end); ``calls`` the helper calls it makes;
``isolation_report`` what the kernel makes of the layers the worker reports;
``environment`` the environment it gets.
"""

from __future__ import annotations

from ...errors import SandboxError
from .environment import ENVIRONMENT_ALLOWED, sandbox_environment
from .repl import SandboxREPL, SandboxRepr, pickled_context

__all__ = [
    "ENVIRONMENT_ALLOWED",
    "SandboxError",
    "SandboxREPL",
    "SandboxRepr",
    "pickled_context",
    "sandbox_environment",
]
