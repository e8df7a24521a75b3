"""Layer 6, syscalls: a seccomp filter of ``DENIED_SYSCALLS`` (no new sockets of any
family, no ptrace, namespaces, mounts, keyrings, bpf, io_uring, fd theft, SysV IPC...),
clone with a namespace flag, and socket calls asking for out-of-band data. Applied
last: the layers before it need some of these.

Standard library only: the sandbox worker imports this.
"""

from __future__ import annotations

import ctypes
import errno
import os
import struct
import sys

from .confinement import Confinement
from .linux import NAMESPACE_FLAGS, PR_SET_NO_NEW_PRIVS, PR_SET_SECCOMP, current_arch
from .policy import DENIED_SYSCALLS, OOB_FLAG_ARGUMENT

MSG_OOB = 0x1


def filter_syscalls(confinement: Confinement) -> None:
    libc, report = confinement.libc, confinement.report
    if libc is None:
        report.refused(
            "syscalls", confinement.off or f"seccomp is Linux-only (this is {sys.platform})"
        )
        return
    arch = current_arch()
    if arch is None:
        report.refused("syscalls", f"no syscall table for {os.uname().machine}")
        return
    program = seccomp_program(*arch)
    filters = (ctypes.c_ubyte * len(program)).from_buffer_copy(program)

    class SockFprog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]

    fprog = SockFprog(len(program) // 8, ctypes.addressof(filters))
    libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
    if libc.prctl(PR_SET_SECCOMP, 2, ctypes.addressof(fprog), 0, 0) != 0:
        report.refused(
            "syscalls", f"seccomp refused the filter ({os.strerror(ctypes.get_errno())})"
        )
        return
    report.layers["syscalls"] = True


def seccomp_program(audit_arch: int, table: dict[str, int], foreign: int | None) -> bytes:
    """A classic BPF program: the wrong architecture is killed; a denied syscall fails
    with EPERM; clone with a namespace flag too; clone3 says ENOSYS (libc then uses
    clone, whose flags can be read)."""
    LD, JEQ, JGE, JSET, RET = 0x20, 0x15, 0x35, 0x45, 0x06
    ALLOW, KILL = 0x7FFF0000, 0x80000000
    EPERM, ENOSYS = 0x00050000 | errno.EPERM, 0x00050000 | errno.ENOSYS
    denied = [table[name] for name in DENIED_SYSCALLS if name in table]
    # (op, jump if true, jump if false, k); a jump may name a label, resolved below.
    code: list[tuple[int, int | str, int | str, int]] = [
        (LD, 0, 0, 4),
        (JEQ, 1, 0, audit_arch),
        (RET, 0, 0, KILL),
        (LD, 0, 0, 0),
    ]
    if foreign is not None:
        code.append((JGE, "deny", 0, foreign))
    code += [(JEQ, "deny", 0, nr) for nr in denied]
    # A socket call with MSG_OOB in its flags (the low 32 bits of that argument, at
    # offset 16 + 8 * index of seccomp_data on the little-endian arches listed).
    for name, index in OOB_FLAG_ARGUMENT.items():
        if name in table:
            code += [
                (JEQ, 0, 2, table[name]),
                (LD, 0, 0, 16 + 8 * index),
                (JSET, "deny", "allow", MSG_OOB),
            ]
    code += [
        (JEQ, "nosys", 0, table["clone3"]),
        (JEQ, 0, "allow", table["clone"]),
        (LD, 0, 0, 16),
        (JSET, "deny", 0, NAMESPACE_FLAGS),
    ]
    labels = {"allow": len(code), "deny": len(code) + 1, "nosys": len(code) + 2}
    code += [(RET, 0, 0, ALLOW), (RET, 0, 0, EPERM), (RET, 0, 0, ENOSYS)]
    out = b""
    for index, (op, jt, jf, k) in enumerate(code):
        jt = labels[jt] - index - 1 if isinstance(jt, str) else jt
        jf = labels[jf] - index - 1 if isinstance(jf, str) else jf
        out += struct.pack("=HBBI", op, jt, jf, k)
    return out
