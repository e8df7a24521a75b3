"""The order the layers are applied in, and the one function that applies them.

The worker confines itself before it reads the context or runs any model code, in
this fixed order (each layer a module of its own; a layer the OS refuses is recorded
in the report, never skipped silently):

1. **namespaces** (``namespaces``) - a user namespace always first, with mount,
   network, IPC, UTS and PID namespaces in the same call; then the sandbox's ids (the
   kernel maps them when it runs as root); then a fork, so that model code runs as pid
   1 of its own PID namespace. Before the call the filesystem layer looks at its paths
   (``filesystem.prepare_sources``), while this process still has its own ids.
2. **filesystem** (``filesystem``) - a fresh, read-only tmpfs as the root, holding only
   the policy's paths, a /proc and /dev/shm of its own and the working folder (noexec).
3. **limits** (``limits``) - address space, processes, open descriptors, no core
   files, file size.
4. **privileges** (``privileges``) - every capability dropped, ``no_new_privs``.
5. **Landlock** (``landlock``) - a second filesystem layer, and the first where the OS
   refuses namespaces.
6. **syscalls** (``syscalls``) - the seccomp filter, an allow-list; last, since the
   layers before it need calls it refuses; Unix sockets only inside the namespaces and
   the filesystem view. Then the network check (``network``), which reads it.

The policy is data (``policy``); the report says which layers hold (``report``).

Standard library only: the sandbox worker imports this.
"""

from __future__ import annotations

from collections.abc import Callable

from . import filesystem, landlock, limits, namespaces, network, privileges, syscalls
from .confinement import Confinement
from .policy import Policy
from .report import Report


def confine(
    policy: Policy,
    *,
    enabled: bool,
    bridge_fd: int,
    map_ids: Callable[[bool], bool],
) -> Report:
    """Apply every layer to this (single-threaded) process, in the order above.

    ``map_ids(needed)`` runs once the namespaces are entered: it tells the kernel
    whether it must map this process's ids (it runs as root) and returns whether it
    did. ``bridge_fd`` is closed in the process left outside the PID namespace, which
    only relays signals from then on. ``enabled=False`` (only tests and benchmarks)
    leaves out every layer but the limits, and the report says so."""
    confinement = Confinement(policy, enabled)
    filesystem.prepare_sources(confinement)  # while this process has its own ids
    needs_ids = namespaces.enter_namespaces(confinement)  # 1.
    namespaces.take_ids(confinement, map_ids(needs_ids))
    namespaces.fork_into_pid_namespace(confinement, bridge_fd)
    filesystem.build_filesystem(confinement)  # 2.
    limits.set_limits(confinement)  # 3.
    privileges.drop_privileges(confinement)  # 4.
    landlock.restrict_with_landlock(confinement)  # 5.
    syscalls.filter_syscalls(confinement)  # 6.
    network.network_check(confinement)
    return confinement.report
