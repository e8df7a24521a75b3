"""The policy: what one sandbox may read, write and call, as data.

``policy_for`` builds the default ``Policy`` in the kernel, which sends it to the worker
as JSON; ``ALLOWED_SYSCALLS`` is the syscall filter's allow-list, and
``DENIED_SYSCALLS`` names what it must never allow. The layers (one module each)
enforce it; reading this module alone tells what the sandbox can reach.

New Unix sockets (``UNIX_SOCKET_SYSCALLS``: multiprocessing's forkserver, Python 3.14's
default start method, listens on one) are allowed only inside the sandbox's own network
namespace and filesystem view, where they reach nothing but the sandbox's own; no other
family ever is, so no network. Where the OS refuses those namespaces, every new socket
stays refused: the comment above ``UNIX_SOCKET_SYSCALLS`` says why, and why not the
worker swapping forkserver for another start method instead.

Why one module: most of its lines are the allow- and deny-lists, one name a line; the
policy is what the sandbox can reach, and read whole in one place it can be judged.

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

# The syscall filter's allow-list: every other syscall fails with EPERM (one newer than
# the tables in linux.py with ENOSYS, as on a kernel without it, so libc falls back).
# Measured: scripts/measure_syscalls.py runs a sandbox's worker under strace with a
# workload of ordinary model code (files, archives, sqlite3, subprocess and 50 command-
# line tools, threads, asyncio, multiprocessing, signals, timers, mmap, select/poll/
# epoll, socketpairs and fd passing, ctypes callbacks, numpy, pandas, matplotlib, the
# helpers) and lists what it made once the filter held: 141 syscalls on x86_64 (glibc
# 2.36, CPython 3.11), all below but two refused on purpose: socket (glibc's lookups
# try nscd's socket, then read the files; a Unix one is allowed in the sandbox's own
# namespaces: UNIX_SOCKET_SYSCALLS) and clone3. Added, marked +: the same
# call's other entry points, which another libc, CPython or tool may use instead
# (aarch64 has only the *at and generic ones). A name missing from an architecture's
# table is skipped. Some are allowed only with certain arguments (syscalls.py): clone
# without namespace flags, socketpair of AF_UNIX, the socket calls without MSG_OOB,
# setsockopt without the buffer sizes, fcntl without F_SETPIPE_SZ; clone3 says ENOSYS
# (libc then uses clone).
ALLOWED_SYSCALLS = (
    # processes and threads
    "clone",
    "fork",
    "vfork",
    "execve",
    "execveat",  # +
    "exit",
    "exit_group",
    "wait4",
    "waitid",  # +
    "kill",
    "tgkill",
    "tkill",  # +
    "pidfd_open",  # + asyncio's child watcher (3.12+)
    "pidfd_send_signal",  # +
    "getpid",
    "getppid",
    "gettid",
    "getpgid",
    "getpgrp",
    "setpgid",
    "getsid",
    "setsid",
    "set_tid_address",
    "set_robust_list",
    "get_robust_list",  # +
    "rseq",
    "arch_prctl",
    "map_shadow_stack",  # + glibc's thread stacks where shadow stacks are on (CET, GCS)
    "prctl",
    "futex",
    "futex_waitv",  # +
    "futex_wake",  # +
    "futex_wait",  # +
    "futex_requeue",  # +
    "membarrier",  # +
    "restart_syscall",
    "sched_yield",
    "sched_getaffinity",
    "sched_setaffinity",  # + numpy's thread pools
    "sched_getparam",  # +
    "sched_getscheduler",  # +
    "sched_get_priority_max",  # +
    "sched_get_priority_min",  # +
    "getcpu",  # +
    "getpriority",
    "setpriority",
    "capget",  # +
    # ids (read only)
    "getuid",
    "geteuid",
    "getgid",
    "getegid",
    "getgroups",
    "getresuid",
    "getresgid",
    # signals and timers
    "rt_sigaction",
    "rt_sigprocmask",
    "rt_sigreturn",
    "rt_sigpending",
    "rt_sigsuspend",
    "rt_sigtimedwait",
    "rt_sigqueueinfo",  # +
    "rt_tgsigqueueinfo",  # +
    "sigaltstack",
    "pause",  # +
    "alarm",
    "getitimer",
    "setitimer",
    "timer_create",
    "timer_settime",
    "timer_gettime",  # +
    "timer_getoverrun",  # +
    "timer_delete",  # +
    "signalfd",  # +
    "signalfd4",  # +
    "timerfd_create",  # +
    "timerfd_settime",  # +
    "timerfd_gettime",  # +
    # time
    "clock_gettime",
    "clock_getres",  # +
    "clock_nanosleep",
    "nanosleep",  # +
    "gettimeofday",  # +
    "time",  # +
    "times",
    # memory
    "brk",
    "mmap",
    "munmap",
    "mprotect",
    "mremap",
    "madvise",
    "msync",
    "mincore",  # +
    "mlock",  # + (RLIMIT_MEMLOCK bounds these)
    "mlock2",  # +
    "munlock",  # +
    "get_mempolicy",
    "set_mempolicy",
    "mbind",
    # files and folders (in the filesystem view and Landlock's rules)
    "read",
    "write",
    "readv",
    "writev",
    "pread64",
    "pwrite64",
    "preadv",  # +
    "pwritev",  # +
    "preadv2",
    "pwritev2",
    "open",  # +
    "openat",
    "openat2",  # +
    "creat",
    "close",
    "close_range",
    "lseek",
    "dup",
    "dup2",
    "dup3",
    "fcntl",
    "flock",
    "fsync",
    "fdatasync",
    "sync_file_range",  # +
    "truncate",
    "ftruncate",
    "fallocate",
    "fadvise64",
    "readahead",  # +
    "stat",  # +
    "fstat",
    "lstat",  # +
    "newfstatat",
    "statx",
    "statfs",
    "fstatfs",
    "access",
    "faccessat",  # +
    "faccessat2",  # + glibc 2.33+, falls back on ENOSYS only
    "getdents",  # +
    "getdents64",
    "getcwd",
    "chdir",
    "fchdir",
    "rename",
    "renameat",  # +
    "renameat2",
    "mkdir",
    "mkdirat",
    "rmdir",
    "link",
    "linkat",  # +
    "unlink",
    "unlinkat",
    "symlink",
    "symlinkat",
    "readlink",
    "readlinkat",  # +
    "chmod",
    "fchmod",
    "fchmodat",
    "fchmodat2",  # + glibc 2.39+, falls back on ENOSYS only
    "chown",
    "fchown",
    "lchown",  # +
    "fchownat",
    "umask",
    "utime",  # +
    "utimes",  # +
    "futimesat",  # +
    "utimensat",
    "mknod",  # + (FIFOs: a device needs a capability the sandbox lacks)
    "mknodat",
    "sendfile",
    "copy_file_range",
    "getxattr",
    "lgetxattr",
    "fgetxattr",  # +
    "listxattr",
    "llistxattr",  # +
    "flistxattr",  # +
    "setxattr",  # + shutil.copy2 copies them
    "lsetxattr",  # +
    "fsetxattr",  # +
    "removexattr",  # +
    "lremovexattr",  # +
    "fremovexattr",  # +
    "inotify_init",  # +
    "inotify_init1",  # +
    "inotify_add_watch",  # +
    "inotify_rm_watch",  # +
    "ioctl",
    # waiting on descriptors
    "select",  # +
    "pselect6",
    "poll",
    "ppoll",  # +
    "epoll_create",  # +
    "epoll_create1",
    "epoll_ctl",
    "epoll_wait",
    "epoll_pwait",  # +
    "epoll_pwait2",  # +
    "eventfd",  # +
    "eventfd2",  # +
    # pipes and the sockets a process already has or pairs (new Unix sockets: below)
    "pipe",  # +
    "pipe2",
    "socketpair",
    "sendto",
    "recvfrom",
    "sendmsg",
    "recvmsg",
    "sendmmsg",  # +
    "recvmmsg",  # +
    "shutdown",
    "getsockname",
    "getpeername",
    "getsockopt",
    "setsockopt",
    # the system, read only, and limits (lowered only: no capability raises them)
    "uname",
    "sysinfo",
    "getrlimit",  # +
    "setrlimit",  # +
    "prlimit64",
    "getrusage",
    "getrandom",
)
# Never allowed, whatever a measurement finds (a test checks none is in the allow-list):
# what would reach out of the sandbox, or pin memory that no limit counts.
DENIED_SYSCALLS = (
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
    "mq_open",  # POSIX message queues: Python has no use for them
    # newer than the deny-list of before: mounts and files seen from outside
    "statmount",
    "listmount",
    "open_tree_attr",
    "file_getattr",
    "file_setattr",
    "quotactl_fd",
    "process_madvise",
    "process_mrelease",
    "lsm_get_self_attr",
    "lsm_set_self_attr",
    "lsm_list_modules",
    "seccomp",
    "setuid",
    "setgid",
    "setgroups",
    "setresuid",
    "setresgid",
    "sync",
    "syncfs",
    "splice",  # pipes holding pages by reference: not needed (sendfile copies)
    "tee",
    "vmsplice",
    "modify_ldt",
    "iopl",
    "ioperm",
)
# Unix sockets of the sandbox's own: socket(2) of AF_UNIX only (any other family, so
# any network socket, is refused) and the calls that name, serve and reach one. Allowed
# only where the sandbox has its own network namespace and its own filesystem view
# (``Confinement.private_view``), because there a Unix socket reaches only what the
# sandbox made: an abstract name is its network namespace's own (and Landlock ABI 6+
# scopes them too), and a path names a socket only in the view, whose writable places
# (the working folder, /dev/shm) are its own tmpfs and whose read-only binds are the
# system's and Python's folders, where no program keeps its sockets (those live in
# /run, /tmp and home folders, none of them in the view). multiprocessing's forkserver
# (Python 3.14's default start method on Linux) listens on such a socket and each new
# process connects to it; so do its managers and asyncio's Unix servers.
# Where the OS refuses the namespaces or the view, all of them stay refused: Landlock
# does not cover connecting to a path, so the host's sockets (a Docker or D-Bus socket,
# an abstract X11 one before Landlock ABI 6) would be reachable. (No Pool works there
# anyway, whatever the start method: its locks are POSIX semaphores, files in a
# /dev/shm, and the host's is out of Landlock's reach.) Not the alternative of making
# the worker swap forkserver for spawn or fork: a forced forkserver would silently be
# another method (fork, in the worker's threaded process, can deadlock), and a Unix
# server of the model's own (asyncio's, a multiprocessing manager's) would still fail.
UNIX_SOCKET_SYSCALLS = ("socket", "bind", "listen", "accept", "accept4", "connect")
# setsockopt at level SOL_SOCKET (1 on x86_64 and aarch64) is refused these options:
# SO_SNDBUF, SO_RCVBUF, SO_SNDBUFFORCE, SO_RCVBUFFORCE. So a socket holds at most the
# system's default buffers (net.core.wmem_default, rmem_default), and fcntl is refused
# F_SETPIPE_SZ, so a pipe holds at most its default 16 pages; RLIMIT_NOFILE (limits.py)
# bounds how many a process has.
SOL_SOCKET = 1
BUFFER_SIZE_OPTIONS = (7, 8, 32, 33)
F_SETPIPE_SZ = 1031
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
    # Descriptors per process. The workload of scripts/measure_syscalls.py (pandas,
    # matplotlib, multiprocessing, 50 tools) opened at most 23 at once; each socket or
    # pipe among them holds at most the system's default buffer (see SOL_SOCKET above).
    max_open_files: int = 256
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
