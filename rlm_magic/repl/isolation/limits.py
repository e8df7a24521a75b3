"""Layer 3, limits: address space per process, a process count (RLIMIT_NPROC, counted
in the sandbox's own user namespace), open descriptors per process (RLIMIT_NOFILE: with
the filter's refusal to enlarge a socket's or a pipe's buffer, this bounds the kernel
memory a process can pin in them), no core files, and no file larger than the working
folder; the disk itself is the working tmpfs's size (layer 2).

Standard library only: the sandbox worker imports this.
"""

from __future__ import annotations

from .confinement import Confinement
from .linux import is_host_root


def set_limits(confinement: Confinement) -> None:
    # Imported here: the package imports this module on every OS (Windows has no
    # resource, and runs the wasm sandbox), and only a Linux worker applies it.
    import resource

    policy, report = confinement.policy, confinement.report
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    # No file larger than the working folder may hold, wherever it is written.
    disk = int(policy.disk_mb) * 2**20
    resource.setrlimit(resource.RLIMIT_FSIZE, (disk, disk))
    files = int(policy.max_open_files)
    resource.setrlimit(resource.RLIMIT_NOFILE, (files, files))
    if policy.memory_mb:
        limit = int(policy.memory_mb) * 2**20
        try:
            resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
            report.layers["memory"] = True
            report.notes["memory"] = (
                f"{policy.memory_mb} MB of address space per process, not for the whole sandbox"
            )
        except (ValueError, OSError) as exc:
            report.refused("memory", f"no address-space limit here ({exc})")
    else:
        report.refused("memory", "sandbox_memory_mb is not set")
    if not confinement.namespaced:
        # Without a user namespace of its own, RLIMIT_NPROC would count every
        # process of this user on the machine.
        report.refused("processes", "no user namespace to count processes in")
        return
    if is_host_root():
        # The kernel exempts the real root user from RLIMIT_NPROC.
        report.refused(
            "processes",
            "the sandbox runs as the real root user, whom RLIMIT_NPROC does not bind",
        )
        return
    try:
        count = int(policy.max_processes)
        resource.setrlimit(resource.RLIMIT_NPROC, (count, count))
        report.layers["processes"] = True
    except (ValueError, OSError) as exc:
        report.refused("processes", f"no process limit here ({exc})")
