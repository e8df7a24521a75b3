"""The policy: what one sandbox may read, write and call, as data.

``policy_for`` builds the default ``Policy`` in the kernel, which sends it to the worker
as JSON; ``DENIED_SYSCALLS`` is the syscall filter's list. The layers (one module each)
enforce it; reading this module alone tells what the sandbox can reach.

Standard library only: the sandbox worker imports this.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field

# The id the sandbox's root becomes outside when the kernel runs as root: "nobody".
SANDBOX_UID = SANDBOX_GID = 65534

# What Python needs of the system, bound read-only (a link, as /lib on merged-/usr
# systems, is made again inside).
SYSTEM_PATHS = (
    "/usr",
    "/bin",
    "/sbin",
    "/lib",
    "/lib32",
    "/lib64",
    "/libx32",
    "/etc/ld.so.cache",
    "/etc/localtime",
)
DEVICES = ("/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom")

DENIED_SYSCALLS = (
    # no new sockets (the bridge is inherited; socketpair stays: asyncio needs it)
    "socket",
    "connect",
    "bind",
    "listen",
    "accept",
    "accept4",
    # no reaching into other processes
    "ptrace",
    "process_vm_readv",
    "process_vm_writev",
    "pidfd_getfd",
    "kcmp",
    # no new namespaces or mounts
    "setns",
    "unshare",
    "mount",
    "umount2",
    "pivot_root",
    "chroot",
    "open_tree",
    "move_mount",
    "fsopen",
    "fsconfig",
    "fsmount",
    "fspick",
    "mount_setattr",
    # kernel interfaces a REPL never needs
    "keyctl",
    "add_key",
    "request_key",
    "bpf",
    "perf_event_open",
    "userfaultfd",
    "io_uring_setup",
    "io_uring_enter",
    "io_uring_register",
    "open_by_handle_at",
    "name_to_handle_at",
    "fanotify_init",
    "kexec_load",
    "kexec_file_load",
    "init_module",
    "finit_module",
    "delete_module",
    "swapon",
    "swapoff",
    "reboot",
    "syslog",
    "acct",
    "quotactl",
    "settimeofday",
    "clock_settime",
    "clock_adjtime",
    "adjtimex",
    "lookup_dcookie",
    "vhangup",
    "personality",
    # memory that no address-space limit counts (a memfd's pages live in no mapping;
    # SysV shared memory and message queues outlive the process, and without a user
    # namespace are the host's: Python and its libraries use POSIX ones, files in /dev/shm)
    "memfd_create",
    "memfd_secret",
    "shmget",
    "shmat",
    "shmctl",
    "shmdt",
    "msgget",
    "msgsnd",
    "msgrcv",
    "msgctl",
    "semget",
    "semop",
    "semtimedop",
    "semctl",
    "ipc",  # the multiplexer some architectures route all of them through
)
# Socket calls refused when their flags ask for out-of-band data (MSG_OOB: a rarely used
# path of Unix sockets, the seat of kernel bugs), by the index of their flags argument.
OOB_FLAG_ARGUMENT = {
    "sendto": 3,
    "recvfrom": 3,
    "sendmsg": 2,
    "recvmsg": 2,
    "sendmmsg": 3,
    "recvmmsg": 3,
}


@dataclass
class Policy:
    """What one sandbox may use; sent by the kernel to the worker as JSON."""

    workdir: str  # the working folder's path (a tmpfs of disk_mb inside)
    read_only: list[str] = field(default_factory=list)
    devices: list[str] = field(default_factory=lambda: list(DEVICES))
    memory_mb: int | None = 4096  # address space, per process
    max_processes: int = 128  # processes and threads (a thread pool counts)
    disk_mb: int = 512
    host_maps_ids: bool = False  # the kernel (root) maps the sandbox to SANDBOX_UID


def policy_for(
    workdir: str, *, memory_mb: int | None, max_processes: int, disk_mb: int, host_maps_ids: bool
) -> Policy:
    """The default policy: the interpreter, its standard library and installed
    packages, and the worker's code, all read-only."""
    # rlm_magic/, three folders up from rlm_magic/repl/isolation/policy.py
    package = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    prefixes = {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix}
    # Installed packages, wherever they live, but not the notebook's own folder (an
    # absolute sys.path entry in some kernels): that is where `.env` files are.
    installed = [
        p
        for p in sys.path
        if os.path.isabs(p)
        and (
            os.path.basename(p.rstrip("/")) in ("site-packages", "dist-packages")
            or any(p.startswith(prefix.rstrip("/") + "/") for prefix in prefixes)
        )
    ]
    python = [*prefixes, os.path.dirname(os.path.realpath(sys.executable)), *installed, package]
    read_only: list[str] = []
    for path in (*SYSTEM_PATHS, *python):
        path = os.path.normpath(path)
        if path != "/" and os.path.lexists(path) and not _covered(path, read_only):
            read_only.append(path)
    return Policy(
        workdir=workdir,
        read_only=read_only,
        memory_mb=memory_mb,
        max_processes=max_processes,
        disk_mb=disk_mb,
        host_maps_ids=host_maps_ids,
    )


def _covered(path: str, bound: list[str]) -> bool:
    """Whether a bind already holds ``path`` (an ancestor on the same filesystem: a
    bind is not recursive, so a path on another mount needs a bind of its own)."""
    for other in bound:
        if path == other or path.startswith(other.rstrip("/") + "/"):
            try:
                return os.stat(path).st_dev == os.stat(other).st_dev
            except OSError:
                return False
    return False
