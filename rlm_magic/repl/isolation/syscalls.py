"""Layer 6, syscalls: a seccomp filter that allows only ``ALLOWED_SYSCALLS`` (what
CPython, the worker and ordinary model code were measured to need) and refuses every
other with EPERM: no network socket (a Unix one only inside the sandbox's own
namespaces and filesystem view, ``policy.UNIX_SOCKET_SYSCALLS``), no ptrace,
namespaces, mounts, keyrings, bpf, io_uring, SysV IPC, nor any syscall Linux adds later
(a number newer than the tables says ENOSYS, as a kernel without it would). Some
allowed calls are refused with certain arguments: clone with a namespace flag, socket
and socketpair of another family than AF_UNIX, socket calls asking for out-of-band
data, setsockopt of a buffer size, fcntl of a pipe's size; clone3 says ENOSYS (libc
then uses clone, whose flags can be read). Applied last: the layers before it need
calls it refuses.

Standard library only: the sandbox worker imports this.
"""

from __future__ import annotations

import ctypes
import errno
import os
import struct
import sys

from .confinement import Confinement
from .linux import (
    NAMESPACE_FLAGS,
    NEWEST_KNOWN,
    PR_SET_NO_NEW_PRIVS,
    PR_SET_SECCOMP,
    Arch,
    current_arch,
)
from .policy import (
    ALLOWED_SYSCALLS,
    BUFFER_SIZE_OPTIONS,
    F_SETPIPE_SZ,
    OOB_FLAG_ARGUMENT,
    SOL_SOCKET,
    UNIX_SOCKET_SYSCALLS,
)

MSG_OOB, AF_UNIX = 0x1, 1
# Classic BPF as seccomp runs it: (op, jump if true, jump if false, k). A conditional
# jump's offsets are 8 bits (at most 255 instructions ahead); JA's is 32 bits.
LD, JA, JEQ, JGT, JGE, JSET, RET = 0x20, 0x05, 0x15, 0x25, 0x35, 0x45, 0x06
ALLOW, KILL = 0x7FFF0000, 0x80000000
EPERM, ENOSYS = 0x00050000 | errno.EPERM, 0x00050000 | errno.ENOSYS
NR, ARCH = 0, 4  # offsets in seccomp_data; the arguments follow at 16, 8 bytes each


def argument(index: int) -> int:
    """The low 32 bits of an argument (all these arches are little-endian, and every
    argument checked is an int or flags in the low half)."""
    return 16 + 8 * index


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
    # Unix sockets only where they reach nothing but the sandbox's own (policy.py).
    allowed = ALLOWED_SYSCALLS + (UNIX_SOCKET_SYSCALLS if confinement.private_view else ())
    program = seccomp_program(arch, allowed)
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


Instruction = tuple[int, int, int, int]


def seccomp_program(arch: Arch, allowed: tuple[str, ...] = ALLOWED_SYSCALLS) -> bytes:
    """The filter: the wrong architecture is killed, a foreign ABI's number (x32) and
    every number not allowed fail with EPERM, a number newer than the tables with
    ENOSYS; the calls with argument rules go through their rule. The allowed numbers
    are found by a binary search over their ranges, so every conditional jump stays
    short however long the list (the far ones are JA)."""
    audit, table, foreign = arch
    code: list[Instruction] = [
        (LD, 0, 0, ARCH),
        (JEQ, 1, 0, audit),
        (RET, 0, 0, KILL),
        (LD, 0, 0, NR),
    ]
    if foreign is not None:
        code += [(JGE, 0, 1, foreign), (RET, 0, 0, EPERM)]
    code += [(JGT, 0, 1, NEWEST_KNOWN), (RET, 0, 0, ENOSYS)]
    ruled = set()
    for name, rule in _argument_rules(allowed):
        if name in table:
            ruled.add(table[name])
            code += [(JEQ, 0, len(rule), table[name]), *rule]
    numbers = sorted({table[name] for name in allowed if name in table} - ruled)
    code += _search(_ranges(numbers))
    return b"".join(struct.pack("=HBBI", *instruction) for instruction in code)


def _argument_rules(allowed: tuple[str, ...]) -> list[tuple[str, list[Instruction]]]:
    """Each call allowed only with certain arguments, and its rule: a block that ends
    in a return whichever way it goes (it is jumped over for every other call)."""
    allow, deny = (RET, 0, 0, ALLOW), (RET, 0, 0, EPERM)
    rules: list[tuple[str, list[Instruction]]] = [("clone3", [(RET, 0, 0, ENOSYS)])]
    if "clone" in allowed:  # no new namespace (its flags are its first argument)
        rules.append(
            ("clone", [(LD, 0, 0, argument(0)), (JSET, 0, 1, NAMESPACE_FLAGS), deny, allow])
        )
    for name in ("socket", "socketpair"):  # Unix sockets only
        if name in allowed:
            rules.append((name, [(LD, 0, 0, argument(0)), (JEQ, 0, 1, AF_UNIX), allow, deny]))
    for name, index in OOB_FLAG_ARGUMENT.items():  # no out-of-band data
        if name in allowed:
            rules.append((name, [(LD, 0, 0, argument(index)), (JSET, 0, 1, MSG_OOB), deny, allow]))
    if "setsockopt" in allowed:  # no socket buffer larger than the system's default
        sizes = [
            (JEQ, len(BUFFER_SIZE_OPTIONS) - i - 1, 0, option)
            for i, option in enumerate(BUFFER_SIZE_OPTIONS)
        ]
        sizes[-1] = (JEQ, 0, 1, BUFFER_SIZE_OPTIONS[-1])
        rules.append(
            (
                "setsockopt",
                [
                    (LD, 0, 0, argument(1)),
                    (JEQ, 0, len(sizes) + 2, SOL_SOCKET),
                    (LD, 0, 0, argument(2)),
                    *sizes,
                    deny,
                    allow,
                ],
            )
        )
    if "fcntl" in allowed:  # no pipe larger than the system's default
        rules.append(("fcntl", [(LD, 0, 0, argument(1)), (JEQ, 0, 1, F_SETPIPE_SZ), deny, allow]))
    return rules


def _ranges(numbers: list[int]) -> list[tuple[int, int]]:
    """Sorted numbers as runs of consecutive ones: [(first, last), ...]."""
    ranges: list[tuple[int, int]] = []
    for number in numbers:
        if ranges and ranges[-1][1] == number - 1:
            ranges[-1] = (ranges[-1][0], number)
        else:
            ranges.append((number, number))
    return ranges


def _search(ranges: list[tuple[int, int]]) -> list[Instruction]:
    """A binary search for the syscall number (in A) among ``ranges``: allowed if in
    one, else EPERM. Each leaf returns itself, so no jump leaves its subtree; an inner
    node skips its left half with JA, whose offset has 32 bits."""
    if not ranges:
        return [(RET, 0, 0, EPERM)]
    if len(ranges) == 1:
        first, last = ranges[0]
        return [(JGT, 2, 0, last), (JGE, 0, 1, first), (RET, 0, 0, ALLOW), (RET, 0, 0, EPERM)]
    middle = len(ranges) // 2
    left, right = _search(ranges[:middle]), _search(ranges[middle:])
    # At or past the right half's first number: to the JA, which jumps over the left half.
    return [(JGE, 0, 1, ranges[middle][0]), (JA, 0, 0, len(left)), *left, *right]
