"""The network check, after the syscall filter: the network layer holds in a namespace
of our own (a loopback that is down, nothing else); without one, if the syscall filter
refuses every new socket.

Standard library only: the sandbox worker imports this.
"""

from __future__ import annotations

from .confinement import Confinement


def network_check(confinement: Confinement) -> None:
    report = confinement.report
    if confinement.namespaced:
        report.layers["network"] = True
    elif report.layers["syscalls"]:
        report.layers["network"] = True
        report.notes["network"] = "no network namespace, but no new socket either (seccomp)"
