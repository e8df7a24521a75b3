"""Layer 4, privileges: every capability dropped (the bounding set too, root made
powerless for exec), ``no_new_privs``.

Standard library only: the sandbox worker imports this.
"""

from __future__ import annotations

import ctypes
import errno
import signal
import struct

from .confinement import Confinement
from .linux import (
    PR_CAP_AMBIENT,
    PR_CAPBSET_DROP,
    PR_SET_NO_NEW_PRIVS,
    PR_SET_PDEATHSIG,
    PR_SET_SECUREBITS,
    SECUREBITS,
    X86_64,
    current_arch,
)


def drop_privileges(confinement: Confinement) -> None:
    libc = confinement.libc
    if libc is None:
        return
    libc.prctl(PR_SET_SECUREBITS, SECUREBITS, 0, 0, 0)  # needs CAP_SETPCAP: first
    for cap in range(64):
        if libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0 and ctypes.get_errno() == errno.EINVAL:
            break
    libc.prctl(PR_CAP_AMBIENT, 4, 0, 0, 0)  # PR_CAP_AMBIENT_CLEAR_ALL
    header = struct.pack("=Ii", 0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3, self
    data = bytes(24)  # effective, permitted, inheritable: empty (two 32-bit words)
    arch = current_arch()
    libc.syscall(
        126 if arch and arch[1] is X86_64 else 91,
        ctypes.c_char_p(header),
        ctypes.c_char_p(data),
    )  # capset
    libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)  # cleared by id changes
