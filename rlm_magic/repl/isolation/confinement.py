"""What the layers share while they confine the worker: the policy, the report they
fill in, libc, and what one layer leaves for a later one (whether namespaces hold, the
paths looked at before them).

Standard library only: the sandbox worker imports this.
"""

from __future__ import annotations

import ctypes
import os
import sys
from dataclasses import dataclass

from .linux import load_libc
from .policy import Policy
from .report import Report


@dataclass(frozen=True)
class Source:
    """A path of the policy as it was looked at with this process's own ids, to be put
    into the sandbox's filesystem view later."""

    kind: str  # "dir", "file" or "link"
    tree: int | None = None  # a detached mount's fd (open_tree), or None to bind by path
    link: str = ""  # a link's target
    locked_flags: int = 0  # the mount flags a bind must keep (the kernel locks them)


class Confinement:
    """One worker process being confined (single-threaded: before any model code)."""

    def __init__(self, policy: Policy, enabled: bool = True):
        self.policy = policy
        self.report = Report()
        self.libc: ctypes.CDLL | None = (
            load_libc() if sys.platform.startswith("linux") and enabled else None
        )
        self.off = None if enabled else "isolation was turned off"  # only tests do that
        self.sources: dict[str, Source] = {}
        self.namespaced = False  # the namespaces hold (so libc was loaded)
        # The filesystem view holds too: a path names only what the sandbox holds, and
        # with the network namespace's own abstract names, a Unix socket reaches only
        # the sandbox's own (policy.UNIX_SOCKET_SYSCALLS).
        self.private_view = False
        self.host_maps_ids = False  # the kernel must map our ids (it runs as root)
        # Our ids outside: inside a new user namespace, before its maps are written,
        # every id reads as the overflow id (65534), which is no id to map.
        self.outer_ids = (os.geteuid(), os.getegid())

    def close_sources(self) -> None:
        for source in self.sources.values():
            if source.tree is not None:
                os.close(source.tree)
        self.sources = {}
