"""Confinement of the sandbox worker: what model-written code can reach (Linux).

The worker calls ``confine`` before it reads the context or runs any model code; it
applies the layers, one module each, in the fixed order ``order`` documents:
namespaces, filesystem, limits, privileges, Landlock, syscalls (then the network
check). The policy is data (``Policy``, ``ALLOWED_SYSCALLS``), built by ``policy_for``
in the kernel; the report (``Report.layers``) comes back to the kernel as
``result.isolation``.

Standard library only: the sandbox worker imports this package.
"""

from __future__ import annotations

from .linux import current_arch as _arch  # noqa: F401 - the old module's name; tests use it
from .linux import load_libc as _libc  # noqa: F401 - the old module's name; tests use it
from .order import confine
from .policy import (
    ALLOWED_SYSCALLS,
    DENIED_SYSCALLS,
    DEVICES,
    SANDBOX_GID,
    SANDBOX_UID,
    SYSTEM_PATHS,
    Policy,
    policy_for,
)
from .report import LAYERS, REQUIRED_LAYERS, Report
from .syscalls import seccomp_program

__all__ = [
    "ALLOWED_SYSCALLS",
    "DENIED_SYSCALLS",
    "DEVICES",
    "LAYERS",
    "REQUIRED_LAYERS",
    "SANDBOX_GID",
    "SANDBOX_UID",
    "SYSTEM_PATHS",
    "Policy",
    "Report",
    "confine",
    "policy_for",
    "seccomp_program",
]
