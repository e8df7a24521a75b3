"""Layer 5, Landlock: read only the policy's paths, write only the working folder, no
TCP, no abstract Unix socket, no signal out of the sandbox (as far as the kernel's ABI
goes). A second layer inside the mount namespace; and the filesystem layer (and what
keeps the kernel from being signalled) where the OS refuses namespaces.

Standard library only: the sandbox worker imports this.
"""

from __future__ import annotations

import ctypes
import os
import struct

from .confinement import Confinement
from .linux import LANDLOCK_ADD_RULE, LANDLOCK_CREATE_RULESET, LANDLOCK_RESTRICT_SELF
from .report import Report

EXECUTE = 1  # LANDLOCK_ACCESS_FS_EXECUTE


def restrict_with_landlock(confinement: Confinement) -> None:
    """Reading only the policy's paths, writing only the working folder, no TCP, no
    abstract Unix sockets and no signals out of the sandbox, each as far as the
    kernel's Landlock ABI goes. With the mount view in force it is a second layer;
    where the OS refused the view (or namespaces) it is the filesystem layer, and
    keeps the kernel from being signalled."""
    libc, policy, report = confinement.libc, confinement.policy, confinement.report
    if libc is None:
        return
    viewed = report.layers["filesystem"]  # the root is our own tmpfs
    abi = libc.syscall(LANDLOCK_CREATE_RULESET, None, 0, 1)  # ..._VERSION
    if abi < 1:
        _note_refusal(report, f"not available ({os.strerror(ctypes.get_errno())})")
        return
    handled = (1 << 13) - 1 | (1 << 13 if abi >= 2 else 0) | (1 << 14 if abi >= 3 else 0)
    handled |= 1 << 15 if abi >= 5 else 0
    attr = struct.pack("=QQQ", handled, 0b11 if abi >= 4 else 0, 0b11 if abi >= 6 else 0)
    size = 24 if abi >= 6 else 16 if abi >= 4 else 8
    ruleset = libc.syscall(LANDLOCK_CREATE_RULESET, ctypes.c_char_p(attr), size, 0)
    if ruleset < 0:
        _note_refusal(report, f"no ruleset ({os.strerror(ctypes.get_errno())})")
        return
    try:
        read_file, read_dir, truncate = 1 | 4, 1 | 4 | 8, 1 << 14 if abi >= 3 else 0
        rules = [(path, read_dir, read_file) for path in policy.read_only]
        rules += [(path, 0, 2 | 4 | truncate) for path in policy.devices]
        # What the sandbox writes is never executed (as its noexec mounts say too).
        writable_dir, writable_file = handled & ~EXECUTE, handled & (2 | 4 | 1 << 14)
        rules.append((policy.workdir, writable_dir, writable_file))
        if viewed:  # its own root (names only, below), /proc and /dev/shm
            rules += [
                ("/", 8, 0),
                ("/proc", read_dir, read_file),
                ("/dev/shm", writable_dir, writable_file),
            ]
        for path, on_dir, on_file in rules:
            _add_rule(libc, ruleset, path, on_dir, on_file)
        if libc.syscall(LANDLOCK_RESTRICT_SELF, ruleset, 0) != 0:
            _note_refusal(report, os.strerror(ctypes.get_errno()))
            return
    finally:
        os.close(ruleset)
    if viewed:
        report.notes.setdefault("filesystem", f"and Landlock ABI {abi}")
        return
    if abi >= 6 and not report.layers["pid"]:
        report.notes["pid"] += "; other processes cannot be signalled (Landlock)"
    why = report.notes.get("filesystem") or "no mount namespace"
    report.layers["filesystem"] = True
    report.notes["filesystem"] = (
        f"Landlock ABI {abi} only: the host's paths, read-only where the policy allows ({why})"
    )


def _add_rule(libc: ctypes.CDLL, ruleset: int, path: str, on_dir: int, on_file: int) -> None:
    try:
        fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
    except OSError:
        return  # not on this machine
    try:
        allowed = (
            on_dir
            if os.path.isdir(f"/proc/self/fd/{fd}") or (on_dir and os.path.isdir(path))
            else on_file
        )
        attr = struct.pack("=Qi", allowed, fd)
        libc.syscall(LANDLOCK_ADD_RULE, ruleset, 1, ctypes.c_char_p(attr), 0)
    finally:
        os.close(fd)


def _note_refusal(report: Report, why: str) -> None:
    """Only news where the mount view did not hold: then nothing limits files."""
    if not report.layers["filesystem"]:
        before = report.notes.get("filesystem") or "no mount namespace"
        report.notes["filesystem"] = (
            f"{before}; and Landlock is {why}"
            if why.startswith("not")
            else f"{before}; and Landlock refused: {why}"
        )
