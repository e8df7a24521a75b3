"""Layer 2, the filesystem view: a fresh, read-only tmpfs becomes the root
(``pivot_root``), holding read-only binds of what Python needs (``Policy.read_only``),
a few devices, a /proc and a small /dev/shm of its own and a size-limited tmpfs as the
working folder, both ``noexec``: what the sandbox writes is never run as a program or
mapped executable (``python3 script.py`` only reads it). No home, venv writes, cache,
/tmp or /dev/shm of the host; no pathname socket but the sandbox's own.

The paths are looked at before the namespaces are entered (``prepare_sources``), while
this process still has its own ids; the view is built inside them (``build_filesystem``).

Standard library only: the sandbox worker imports this.
"""

from __future__ import annotations

import os

from .confinement import Confinement, Source
from .linux import (
    MNT_DETACH,
    MOVE_MOUNT_F_EMPTY_PATH,
    MS_BIND,
    MS_NOATIME,
    MS_NODEV,
    MS_NODIRATIME,
    MS_NOEXEC,
    MS_NOSUID,
    MS_PRIVATE,
    MS_RDONLY,
    MS_REC,
    MS_RELATIME,
    MS_REMOUNT,
    MS_STRICTATIME,
    OPEN_TREE_CLONE,
    check,
    current_arch,
    syscall_number,
)
from .policy import SYSTEM_PATHS


def prepare_sources(confinement: Confinement, clone: bool | None = None) -> None:
    """Look at every path while this process still has its own ids. As root (the
    sandbox will be SANDBOX_UID, who may not walk to a venv under /root), each path
    is cloned as a detached mount (open_tree) to be attached inside; if the OS
    cannot, the sandbox stays this user and binds by path."""
    libc, policy = confinement.libc, confinement.policy
    if libc is None:  # no namespaces to enter (refused in enter_namespaces)
        return
    if clone is None:
        clone = policy.host_maps_ids and current_arch() is not None
    confinement.host_maps_ids = clone
    for path in policy.read_only + policy.devices:
        try:
            if os.path.islink(path) and path in SYSTEM_PATHS:
                confinement.sources[path] = Source("link", link=os.readlink(path))
                continue
            kind, flags = ("dir" if os.path.isdir(path) else "file"), _locked_flags(path)
        except OSError:
            continue  # not on this machine
        tree = None
        if clone:
            tree = libc.syscall(
                syscall_number("open_tree"), -100, path.encode(), OPEN_TREE_CLONE | os.O_CLOEXEC
            )
            if tree < 0:  # a kernel before 5.2: the sandbox keeps this user's ids
                confinement.close_sources()
                return prepare_sources(confinement, clone=False)
        confinement.sources[path] = Source(kind, tree=tree, locked_flags=flags)


def build_filesystem(confinement: Confinement) -> None:
    """pivot_root into a fresh read-only tmpfs holding only the policy's paths."""
    if not confinement.namespaced:
        return
    try:
        _build_filesystem(confinement)
        confinement.report.layers["filesystem"] = True
        confinement.private_view = True
    except OSError as exc:
        confinement.report.refused("filesystem", f"the filesystem view failed ({exc})")
    finally:
        confinement.close_sources()


def _build_filesystem(confinement: Confinement) -> None:
    libc, policy = confinement.libc, confinement.policy
    assert libc is not None  # namespaces hold: this is Linux
    check(libc.mount(None, b"/", None, MS_REC | MS_PRIVATE, None), "making / private")
    root = policy.workdir.encode()  # an empty folder of the kernel's: our new root
    check(
        libc.mount(
            b"tmpfs", root, b"tmpfs", MS_NOSUID | MS_NODEV, b"mode=0755,size=1m,nr_inodes=4096"
        ),
        "mounting the root tmpfs",
    )
    for path in policy.read_only:
        _bind(confinement, path, root)
    _makedirs(root, "/dev")
    for path in policy.devices:
        _bind(confinement, path, root, device=True)
    _makedirs(root, "/dev/shm")  # its own (multiprocessing's semaphores live there)
    check(
        libc.mount(
            b"tmpfs",
            root + b"/dev/shm",
            b"tmpfs",
            MS_NOSUID | MS_NODEV | MS_NOEXEC,
            f"mode=1777,size={min(policy.disk_mb, 64)}m".encode(),
        ),
        "mounting /dev/shm",
    )
    work = root + policy.workdir.encode()
    _makedirs(root, policy.workdir)
    check(
        libc.mount(
            b"tmpfs",
            work,
            b"tmpfs",
            MS_NOSUID | MS_NODEV | MS_NOEXEC,  # nothing the model writes is run as a program
            f"mode=0700,size={policy.disk_mb}m".encode(),
        ),
        "mounting the working folder",
    )
    _makedirs(root, "/proc")
    if libc.mount(b"proc", root + b"/proc", b"proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, None) != 0:
        confinement.report.notes["filesystem"] = (
            "no /proc: the OS refused one for the sandbox's PID namespace"
        )
    os.chdir(root)
    os.mkdir(".old-root")
    check(libc.syscall(syscall_number("pivot_root"), b".", b".old-root"), "pivot_root")
    check(libc.umount2(b"/.old-root", MNT_DETACH), "detaching the old root")
    os.rmdir("/.old-root")
    check(
        libc.mount(None, b"/", None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV, None),
        "making the root read-only",
    )
    os.chdir(policy.workdir)


def _bind(confinement: Confinement, path: str, root: bytes, device: bool = False) -> None:
    libc = confinement.libc
    assert libc is not None  # namespaces hold: this is Linux
    source = confinement.sources.get(path)
    if source is None:
        return
    target = root + path.encode()
    if source.kind == "link":  # /lib -> usr/lib on merged-/usr systems
        _makedirs(root, os.path.dirname(path))
        if not os.path.lexists(target):
            os.symlink(source.link, target)
        return
    if source.kind == "dir":
        _makedirs(root, path)
    else:
        _makedirs(root, os.path.dirname(path))
        if not os.path.exists(target):
            with open(target, "wb"):
                pass
    if source.tree is not None:
        check(
            0
            if libc.syscall(
                syscall_number("move_mount"),
                source.tree,
                b"",
                -100,
                target,
                MOVE_MOUNT_F_EMPTY_PATH,
            )
            == 0
            else -1,
            f"attaching {path}",
        )
    else:
        check(libc.mount(path.encode(), target, None, MS_BIND, None), f"binding {path}")
    flags = MS_REMOUNT | MS_BIND | MS_NOSUID | source.locked_flags
    flags |= MS_NOEXEC if device else MS_NODEV | MS_RDONLY
    check(libc.mount(None, target, None, flags, None), f"remounting {path}")


def _locked_flags(path: str) -> int:
    """Mount flags a bind in a user namespace must keep (the kernel locks them)."""
    flags = os.statvfs(path).f_flag
    out = MS_NOEXEC if flags & os.ST_NOEXEC else 0
    out |= MS_RDONLY if flags & os.ST_RDONLY else 0
    if flags & os.ST_NOATIME:
        out |= MS_NOATIME
    elif flags & os.ST_RELATIME:
        out |= MS_RELATIME
    else:
        out |= MS_STRICTATIME
    return out | (MS_NODIRATIME if flags & os.ST_NODIRATIME else 0)


def _makedirs(root: bytes, path: str) -> None:
    os.makedirs(root + path.encode(), mode=0o755, exist_ok=True)
