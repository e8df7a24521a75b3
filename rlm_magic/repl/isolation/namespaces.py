"""Layer 1, namespaces: a user namespace always first, with mount, network, IPC, UTS
and PID namespaces in the same call; then the sandbox's ids; then the fork that makes
the worker pid 1 of its own PID namespace.

A user namespace first matters: root entering a network namespace alone keeps every
capability. As root, the kernel maps the sandbox's root to ``SANDBOX_UID``, an
unprivileged id; otherwise the worker maps itself. After the fork, model code sees and
signals no other process, and all it starts dies with it; the first process stays
outside, only relaying signals and the exit status.

Standard library only: the sandbox worker imports this.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys

from .confinement import Confinement
from .linux import (
    CLONE_NEWIPC,
    CLONE_NEWNET,
    CLONE_NEWNS,
    CLONE_NEWPID,
    CLONE_NEWUSER,
    CLONE_NEWUTS,
    PR_SET_DUMPABLE,
    PR_SET_PDEATHSIG,
    is_host_root,
)

# The layers that hold only inside namespaces of the sandbox's own.
_NAMESPACED_LAYERS = ("user", "pid", "filesystem", "network")


def enter_namespaces(confinement: Confinement) -> bool:
    """unshare(2) the user namespace with all the others at once. Returns whether
    the kernel must now map this process's ids (``host_maps_ids``)."""
    libc, report = confinement.libc, confinement.report
    if libc is None:
        for layer in _NAMESPACED_LAYERS:
            report.refused(layer, confinement.off or f"Linux only (this is {sys.platform})")
        return False
    flags = CLONE_NEWUSER | CLONE_NEWNS | CLONE_NEWNET | CLONE_NEWIPC | CLONE_NEWUTS | CLONE_NEWPID
    if libc.unshare(flags) != 0:
        why = os.strerror(ctypes.get_errno())
        for layer in _NAMESPACED_LAYERS:
            report.refused(layer, f"unshare() refused a user namespace ({why})")
        confinement.close_sources()
        return False
    confinement.namespaced = True
    return confinement.host_maps_ids


def take_ids(confinement: Confinement, mapped_by_host: bool) -> None:
    """Become the user the sandbox runs as: the unprivileged id the kernel mapped
    us to (as root), else ourselves, mapped one to one."""
    libc, report = confinement.libc, confinement.report
    if not confinement.namespaced or libc is None:
        return
    try:
        if mapped_by_host:
            os.setresgid(0, 0, 0)
            os.setgroups([])
            os.setresuid(0, 0, 0)  # now SANDBOX_UID outside; caps in here only
        else:
            uid, gid = confinement.outer_ids
            _write("/proc/self/setgroups", "deny")
            _write("/proc/self/uid_map", f"{uid} {uid} 1")
            _write("/proc/self/gid_map", f"{gid} {gid} 1")
    except OSError as exc:  # e.g. an AppArmor rule that allows the namespace, not ids
        report.refused("user", f"the OS refused the user namespace's ids ({exc})")
        return
    report.layers["user"] = True
    if not mapped_by_host and is_host_root():
        report.notes["user"] = (
            "its root is the real root, without any capability (the kernel could not map it)"
        )
    libc.prctl(PR_SET_DUMPABLE, 1, 0, 0, 0)


def fork_into_pid_namespace(confinement: Confinement, bridge_fd: int) -> None:
    """Fork: the child is pid 1 of the new PID namespace and goes on as the worker;
    this process relays SIGINT to it and exits with its status. It never returns."""
    libc = confinement.libc
    if not confinement.namespaced or libc is None:
        return
    child = os.fork()
    if child == 0:
        # If the relay is killed (as the kernel ends a sandbox), so is pid 1, and with
        # it the namespace. (Should it die before this line, the kernel has closed
        # the bridge too, and the worker ends on reading EOF.)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        confinement.report.layers["pid"] = True
        return
    os.close(bridge_fd)
    confinement.close_sources()
    _relay(child)


def _relay(child: int) -> None:
    """The first process's whole life after the fork: pass SIGINT (the kernel's
    interrupt) to the worker, and exit as it did."""
    signal.signal(signal.SIGINT, lambda *_: _forward(child, signal.SIGINT))
    signal.signal(signal.SIGTERM, lambda *_: _forward(child, signal.SIGKILL))
    while True:
        try:
            _, status = os.waitpid(child, 0)
            break
        except InterruptedError:
            continue
        except ChildProcessError:
            os._exit(1)
    if os.WIFSIGNALED(status):
        signum = os.WTERMSIG(status)
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)
    os._exit(os.waitstatus_to_exitcode(status) if os.WIFEXITED(status) else 1)


def _forward(pid: int, signum: int) -> None:
    try:
        os.kill(pid, signum)
    except ProcessLookupError:
        pass


def _write(path: str, text: str) -> None:
    with open(path, "w") as file:
        file.write(text)
