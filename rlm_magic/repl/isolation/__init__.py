"""Confinement of the sandbox worker: what model-written code can reach (Linux).

The worker applies it before it reads the context or runs any model code, in this
fixed order (each layer is one function below; a layer the OS refuses is recorded in
the report, never skipped silently):

1. **namespaces** - a user namespace always comes first (as root, the kernel maps the
   sandbox's root to ``SANDBOX_UID``, an unprivileged id; otherwise the user maps
   itself), with mount, network, IPC, UTS and PID namespaces in the same call. A user
   namespace first matters: root entering a network namespace alone keeps every
   capability. The worker then forks: model code runs as pid 1 of its own PID
   namespace, so it sees and signals no other process, and all it starts dies with it.
   The first process stays outside, only relaying signals and the exit status.
2. **filesystem** - a fresh, read-only tmpfs becomes the root (``pivot_root``), holding
   read-only binds of what Python needs (``Policy.read_only``), a few devices, a /proc
   and a small /dev/shm of its own and a size-limited tmpfs as the working folder. No
   home, venv writes, cache, /tmp or /dev/shm of the host; no pathname socket.
3. **limits** - address space per process, a process count (RLIMIT_NPROC, counted in
   the sandbox's own user namespace), no core files; disk is the working tmpfs's size.
4. **privileges** - every capability dropped (bounding set too, root made powerless
   for exec), ``no_new_privs``.
5. **Landlock** - read only the policy's paths, write only the working folder, no TCP,
   no abstract Unix socket, no signal out of the sandbox (as far as the kernel's ABI
   goes): a second layer inside the mount namespace, and the filesystem layer (and what
   keeps the kernel from being signalled) where the OS refuses namespaces.
6. **syscalls** - a seccomp filter (``DENIED_SYSCALLS``): no new sockets of any family,
   no ptrace, namespaces, mounts, keyrings, bpf, io_uring, fd theft...

The policy is data (``Policy``, ``DENIED_SYSCALLS``), built by ``policy_for``; the host
reads the report (``Report.layers``) into ``result.isolation``.

Standard library only: the worker imports this.
"""

from __future__ import annotations

import ctypes
import errno
import os
import resource
import signal
import struct
import sys
from dataclasses import asdict, dataclass, field

# The id the sandbox's root becomes outside when the kernel runs as root: "nobody".
SANDBOX_UID = SANDBOX_GID = 65534
LAYERS = ("user", "pid", "filesystem", "network", "syscalls", "processes", "memory")
# Layers that together make "full isolation" (RLM.sandbox_require_isolation). The
# memory cap is per process (no cgroup is used), so it is reported, not required.
REQUIRED_LAYERS = ("user", "pid", "filesystem", "network", "syscalls", "processes")

# -- the policy: what the sandbox may read, write and call ------------------------------
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
    # memory that no address-space limit counts (a memfd's pages live in no mapping)
    "memfd_create",
    "memfd_secret",
)


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
    # rlm_magic/, three folders up from rlm_magic/repl/isolation/__init__.py
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


@dataclass
class Report:
    """Which layers are in force, and why any is not (one short reason each)."""

    layers: dict[str, bool] = field(default_factory=lambda: dict.fromkeys(LAYERS, False))
    notes: dict[str, str] = field(default_factory=dict)

    def refused(self, layer: str, why: str) -> None:
        self.layers[layer] = False
        self.notes.setdefault(layer, why)

    def as_dict(self) -> dict:
        return asdict(self)


# -- constants from the Linux headers -------------------------------------------------
CLONE_NEWNS, CLONE_NEWCGROUP, CLONE_NEWUTS = 0x00020000, 0x02000000, 0x04000000
CLONE_NEWIPC, CLONE_NEWUSER = 0x08000000, 0x10000000
CLONE_NEWPID, CLONE_NEWNET, CLONE_NEWTIME = 0x20000000, 0x40000000, 0x00000080
# (clone's low byte is its exit signal, so CLONE_NEWTIME, clone3-only, is left out)
_NAMESPACE_FLAGS = (
    CLONE_NEWNS
    | CLONE_NEWCGROUP
    | CLONE_NEWUTS
    | CLONE_NEWIPC
    | CLONE_NEWUSER
    | CLONE_NEWPID
    | CLONE_NEWNET
)
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 32, 4096, 16384, 1 << 18
MS_NOATIME, MS_NODIRATIME, MS_RELATIME, MS_STRICTATIME = 1024, 2048, 1 << 21, 1 << 24
MNT_DETACH = 2
OPEN_TREE_CLONE, MOVE_MOUNT_F_EMPTY_PATH = 1, 4
# Landlock's syscalls have one number on every architecture.
_LANDLOCK_CREATE_RULESET, _LANDLOCK_ADD_RULE, _LANDLOCK_RESTRICT_SELF = 444, 445, 446
PR_SET_PDEATHSIG, PR_SET_DUMPABLE, PR_SET_SECCOMP = 1, 4, 22
PR_CAPBSET_DROP, PR_SET_SECUREBITS, PR_SET_NO_NEW_PRIVS, PR_CAP_AMBIENT = 24, 28, 38, 47
# NOROOT, NO_SETUID_FIXUP and KEEP_CAPS, each locked: root gains nothing on exec.
_SECUREBITS = 0x01 | 0x02 | 0x04 | 0x08 | 0x20

# Syscall numbers per architecture, for the names the filter and this module use.
_X86_64 = dict(
    socket=41,
    connect=42,
    accept=43,
    bind=49,
    listen=50,
    accept4=288,
    ptrace=101,
    process_vm_readv=310,
    process_vm_writev=311,
    pidfd_getfd=438,
    kcmp=312,
    setns=308,
    unshare=272,
    mount=165,
    umount2=166,
    pivot_root=155,
    chroot=161,
    open_tree=428,
    move_mount=429,
    fsopen=430,
    fsconfig=431,
    fsmount=432,
    fspick=433,
    mount_setattr=442,
    keyctl=250,
    add_key=248,
    request_key=249,
    bpf=321,
    perf_event_open=298,
    userfaultfd=323,
    io_uring_setup=425,
    io_uring_enter=426,
    io_uring_register=427,
    open_by_handle_at=304,
    name_to_handle_at=303,
    fanotify_init=300,
    kexec_load=246,
    kexec_file_load=320,
    init_module=175,
    finit_module=313,
    delete_module=176,
    swapon=167,
    swapoff=168,
    reboot=169,
    syslog=103,
    acct=163,
    quotactl=179,
    settimeofday=164,
    clock_settime=227,
    clock_adjtime=305,
    adjtimex=159,
    lookup_dcookie=212,
    vhangup=153,
    personality=135,
    clone=56,
    clone3=435,
    memfd_create=319,
    memfd_secret=447,
)
_AARCH64 = dict(
    socket=198,
    connect=203,
    accept=202,
    bind=200,
    listen=201,
    accept4=242,
    ptrace=117,
    process_vm_readv=270,
    process_vm_writev=271,
    pidfd_getfd=438,
    kcmp=272,
    setns=268,
    unshare=97,
    mount=40,
    umount2=39,
    pivot_root=41,
    chroot=51,
    open_tree=428,
    move_mount=429,
    fsopen=430,
    fsconfig=431,
    fsmount=432,
    fspick=433,
    mount_setattr=442,
    keyctl=219,
    add_key=217,
    request_key=218,
    bpf=280,
    perf_event_open=241,
    userfaultfd=282,
    io_uring_setup=425,
    io_uring_enter=426,
    io_uring_register=427,
    open_by_handle_at=265,
    name_to_handle_at=264,
    fanotify_init=262,
    kexec_load=104,
    kexec_file_load=294,
    init_module=105,
    finit_module=273,
    delete_module=106,
    swapon=224,
    swapoff=225,
    reboot=142,
    syslog=116,
    acct=89,
    quotactl=60,
    settimeofday=170,
    clock_settime=112,
    clock_adjtime=266,
    adjtimex=171,
    lookup_dcookie=18,
    vhangup=58,
    personality=92,
    clone=220,
    clone3=435,
    memfd_create=279,
    memfd_secret=447,
)
# (audit arch, syscall table, first number of a foreign ABI sharing the arch, or None)
_ARCHES = {"x86_64": (0xC000003E, _X86_64, 0x40000000), "aarch64": (0xC00000B7, _AARCH64, None)}


def _libc():
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    libc.mount.argtypes = (
        ctypes.c_char_p,
        ctypes.c_char_p,
        ctypes.c_char_p,
        ctypes.c_ulong,
        ctypes.c_char_p,
    )
    libc.umount2.argtypes = (ctypes.c_char_p, ctypes.c_int)
    libc.prctl.argtypes = (
        ctypes.c_int,
        ctypes.c_ulong,
        ctypes.c_ulong,
        ctypes.c_ulong,
        ctypes.c_ulong,
    )
    return libc


def _check(result: int, what: str) -> None:
    if result != 0:
        code = ctypes.get_errno()
        raise OSError(code, f"{what}: {os.strerror(code)}")


def _arch():
    return _ARCHES.get(os.uname().machine)


# -- 1. namespaces ---------------------------------------------------------------------
class Confinement:
    """Applies a ``Policy`` in this (single-threaded) worker process, in order."""

    def __init__(self, policy: Policy, enabled: bool = True):
        self.policy = policy
        self.report = Report()
        self.libc = _libc() if sys.platform.startswith("linux") and enabled else None
        self.off = None if enabled else "isolation was turned off"  # only tests do that
        # path -> (kind: "dir", "file" or "link"; a detached mount's fd, None to bind by
        # path, or a link's target; the mount flags a bind must keep)
        self.sources: dict[str, tuple] = {}
        self.namespaced = False
        self.host_maps_ids = False
        # Our ids outside: inside a new user namespace, before its maps are written,
        # every id reads as the overflow id (65534), which is no id to map.
        self.outer_ids = (os.geteuid(), os.getegid())

    def enter_namespaces(self) -> bool:
        """unshare(2) the user namespace with all the others at once. Returns whether
        the kernel must now map this process's ids (``host_maps_ids``)."""
        if self.libc is None:
            for layer in ("user", "pid", "filesystem", "network"):
                self.report.refused(layer, self.off or f"Linux only (this is {sys.platform})")
            return False
        self._prepare_sources()
        flags = (
            CLONE_NEWUSER | CLONE_NEWNS | CLONE_NEWNET | CLONE_NEWIPC | CLONE_NEWUTS | CLONE_NEWPID
        )
        if self.libc.unshare(flags) != 0:
            why = os.strerror(ctypes.get_errno())
            for layer in ("user", "pid", "filesystem", "network"):
                self.report.refused(layer, f"unshare() refused a user namespace ({why})")
            self._close_sources()
            return False
        self.namespaced = True
        return self.host_maps_ids

    def _prepare_sources(self, clone: bool | None = None) -> None:
        """Look at every path while this process still has its own ids. As root (the
        sandbox will be SANDBOX_UID, who may not walk to a venv under /root), each path
        is cloned as a detached mount (open_tree) to be attached inside; if the OS
        cannot, the sandbox stays this user and binds by path."""
        if clone is None:
            clone = self.policy.host_maps_ids and _arch() is not None
        self.host_maps_ids = clone
        for path in self.policy.read_only + self.policy.devices:
            try:
                if os.path.islink(path) and path in SYSTEM_PATHS:
                    self.sources[path] = ("link", os.readlink(path), 0)
                    continue
                kind, flags = ("dir" if os.path.isdir(path) else "file"), _locked_flags(path)
            except OSError:
                continue  # not on this machine
            tree = None
            if clone:
                tree = self.libc.syscall(
                    _syscall("open_tree"), -100, path.encode(), OPEN_TREE_CLONE | os.O_CLOEXEC
                )
                if tree < 0:  # a kernel before 5.2: the sandbox keeps this user's ids
                    self._close_sources()
                    return self._prepare_sources(clone=False)
            self.sources[path] = (kind, tree, flags)

    def take_ids(self, mapped_by_host: bool) -> None:
        """Become the user the sandbox runs as: the unprivileged id the kernel mapped
        us to (as root), else ourselves, mapped one to one."""
        if not self.namespaced:
            return
        try:
            if mapped_by_host:
                os.setresgid(0, 0, 0)
                os.setgroups([])
                os.setresuid(0, 0, 0)  # now SANDBOX_UID outside; caps in here only
            else:
                uid, gid = self.outer_ids
                _write("/proc/self/setgroups", "deny")
                _write("/proc/self/uid_map", f"{uid} {uid} 1")
                _write("/proc/self/gid_map", f"{gid} {gid} 1")
        except OSError as exc:  # e.g. an AppArmor rule that allows the namespace, not ids
            self.report.refused("user", f"the OS refused the user namespace's ids ({exc})")
            return
        self.report.layers["user"] = True
        if not mapped_by_host and _is_host_root():
            self.report.notes["user"] = (
                "its root is the real root, without any capability (the kernel could not map it)"
            )
        self.libc.prctl(PR_SET_DUMPABLE, 1, 0, 0, 0)

    def fork_into_pid_namespace(self, bridge_fd: int) -> None:
        """Fork: the child is pid 1 of the new PID namespace and goes on as the worker;
        this process relays SIGINT to it and exits with its status. It never returns."""
        if not self.namespaced:
            return
        child = os.fork()
        if child == 0:
            # If the relay is killed (as the kernel ends a sandbox), so is pid 1, and with
            # it the namespace. (Should it die before this line, the kernel has closed
            # the bridge too, and the worker ends on reading EOF.)
            self.libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
            self.report.layers["pid"] = True
            return
        os.close(bridge_fd)
        self._close_sources()
        _relay(child)

    # -- 2. filesystem -----------------------------------------------------------------
    def build_filesystem(self) -> None:
        """pivot_root into a fresh read-only tmpfs holding only the policy's paths."""
        if not self.namespaced:
            return
        try:
            self._build_filesystem()
            self.report.layers["filesystem"] = True
        except OSError as exc:
            self.report.refused("filesystem", f"the filesystem view failed ({exc})")
        finally:
            self._close_sources()

    def _build_filesystem(self) -> None:
        libc, policy = self.libc, self.policy
        _check(libc.mount(None, b"/", None, MS_REC | MS_PRIVATE, None), "making / private")
        root = policy.workdir.encode()  # an empty folder of the kernel's: our new root
        _check(
            libc.mount(
                b"tmpfs", root, b"tmpfs", MS_NOSUID | MS_NODEV, b"mode=0755,size=1m,nr_inodes=4096"
            ),
            "mounting the root tmpfs",
        )
        for path in policy.read_only:
            self._bind(path, root)
        _makedirs(root, "/dev")
        for path in policy.devices:
            self._bind(path, root, device=True)
        _makedirs(root, "/dev/shm")  # its own (multiprocessing's semaphores live there)
        _check(
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
        _check(
            libc.mount(
                b"tmpfs",
                work,
                b"tmpfs",
                MS_NOSUID | MS_NODEV,
                f"mode=0700,size={policy.disk_mb}m".encode(),
            ),
            "mounting the working folder",
        )
        _makedirs(root, "/proc")
        if (
            libc.mount(b"proc", root + b"/proc", b"proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, None)
            != 0
        ):
            self.report.notes["filesystem"] = (
                "no /proc: the OS refused one for the sandbox's PID namespace"
            )
        os.chdir(root)
        os.mkdir(".old-root")
        _check(libc.syscall(_syscall("pivot_root"), b".", b".old-root"), "pivot_root")
        _check(libc.umount2(b"/.old-root", MNT_DETACH), "detaching the old root")
        os.rmdir("/.old-root")
        _check(
            libc.mount(
                None, b"/", None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV, None
            ),
            "making the root read-only",
        )
        os.chdir(policy.workdir)

    def _bind(self, path: str, root: bytes, device: bool = False) -> None:
        source = self.sources.get(path)
        if source is None:
            return
        kind, tree, locked = source
        target = root + path.encode()
        if kind == "link":  # /lib -> usr/lib on merged-/usr systems
            _makedirs(root, os.path.dirname(path))
            if not os.path.lexists(target):
                os.symlink(tree, target)
            return
        if kind == "dir":
            _makedirs(root, path)
        else:
            _makedirs(root, os.path.dirname(path))
            if not os.path.exists(target):
                with open(target, "wb"):
                    pass
        if tree is not None:
            _check(
                0
                if self.libc.syscall(
                    _syscall("move_mount"), tree, b"", -100, target, MOVE_MOUNT_F_EMPTY_PATH
                )
                == 0
                else -1,
                f"attaching {path}",
            )
        else:
            _check(self.libc.mount(path.encode(), target, None, MS_BIND, None), f"binding {path}")
        flags = MS_REMOUNT | MS_BIND | MS_NOSUID | locked
        flags |= MS_NOEXEC if device else MS_NODEV | MS_RDONLY
        _check(self.libc.mount(None, target, None, flags, None), f"remounting {path}")

    def _close_sources(self) -> None:
        for kind, tree, _ in self.sources.values():
            if kind != "link" and tree is not None:
                os.close(tree)
        self.sources = {}

    # -- 3. limits -----------------------------------------------------------------------
    def set_limits(self) -> None:
        policy = self.policy
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        # No file larger than the working folder may hold, wherever it is written.
        disk = int(policy.disk_mb) * 2**20
        resource.setrlimit(resource.RLIMIT_FSIZE, (disk, disk))
        if policy.memory_mb:
            limit = int(policy.memory_mb) * 2**20
            try:
                resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
                self.report.layers["memory"] = True
                self.report.notes["memory"] = (
                    f"{policy.memory_mb} MB of address space per process, not for the whole sandbox"
                )
            except (ValueError, OSError) as exc:
                self.report.refused("memory", f"no address-space limit here ({exc})")
        else:
            self.report.refused("memory", "sandbox_memory_mb is not set")
        if not self.namespaced:
            # Without a user namespace of its own, RLIMIT_NPROC would count every
            # process of this user on the machine.
            self.report.refused("processes", "no user namespace to count processes in")
            return
        if _is_host_root():
            # The kernel exempts the real root user from RLIMIT_NPROC.
            self.report.refused(
                "processes",
                "the sandbox runs as the real root user, whom RLIMIT_NPROC does not bind",
            )
            return
        try:
            count = int(policy.max_processes)
            resource.setrlimit(resource.RLIMIT_NPROC, (count, count))
            self.report.layers["processes"] = True
        except (ValueError, OSError) as exc:
            self.report.refused("processes", f"no process limit here ({exc})")

    # -- 4. privileges ------------------------------------------------------------------
    def drop_privileges(self) -> None:
        libc = self.libc
        if libc is None:
            return
        libc.prctl(PR_SET_SECUREBITS, _SECUREBITS, 0, 0, 0)  # needs CAP_SETPCAP: first
        for cap in range(64):
            if (
                libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0
                and ctypes.get_errno() == errno.EINVAL
            ):
                break
        libc.prctl(PR_CAP_AMBIENT, 4, 0, 0, 0)  # PR_CAP_AMBIENT_CLEAR_ALL
        header = struct.pack("=Ii", 0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3, self
        data = bytes(24)  # effective, permitted, inheritable: empty (two 32-bit words)
        libc.syscall(
            126 if _arch() and _arch()[1] is _X86_64 else 91,
            ctypes.c_char_p(header),
            ctypes.c_char_p(data),
        )  # capset
        libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)  # cleared by id changes

    # -- 5. Landlock: a second filesystem layer, and the first where namespaces are refused
    def restrict_with_landlock(self) -> None:
        """Reading only the policy's paths, writing only the working folder, no TCP, no
        abstract Unix sockets and no signals out of the sandbox, each as far as the
        kernel's Landlock ABI goes. With the mount view in force it is a second layer;
        where the OS refused the view (or namespaces) it is the filesystem layer, and
        keeps the kernel from being signalled."""
        libc = self.libc
        if libc is None:
            return
        viewed = self.report.layers["filesystem"]  # the root is our own tmpfs
        abi = libc.syscall(_LANDLOCK_CREATE_RULESET, None, 0, 1)  # ..._VERSION
        if abi < 1:
            self._landlock_refused(f"not available ({os.strerror(ctypes.get_errno())})")
            return
        handled = (1 << 13) - 1 | (1 << 13 if abi >= 2 else 0) | (1 << 14 if abi >= 3 else 0)
        handled |= 1 << 15 if abi >= 5 else 0
        attr = struct.pack("=QQQ", handled, 0b11 if abi >= 4 else 0, 0b11 if abi >= 6 else 0)
        size = 24 if abi >= 6 else 16 if abi >= 4 else 8
        ruleset = libc.syscall(_LANDLOCK_CREATE_RULESET, ctypes.c_char_p(attr), size, 0)
        if ruleset < 0:
            self._landlock_refused(f"no ruleset ({os.strerror(ctypes.get_errno())})")
            return
        try:
            read_file, read_dir, truncate = 1 | 4, 1 | 4 | 8, 1 << 14 if abi >= 3 else 0
            rules = [(path, read_dir, read_file) for path in self.policy.read_only]
            rules += [(path, 0, 2 | 4 | truncate) for path in self.policy.devices]
            rules.append((self.policy.workdir, handled, handled & (1 | 2 | 4 | 1 << 14)))
            if viewed:  # its own root (names only, below), /proc and /dev/shm
                rules += [
                    ("/", 8, 0),
                    ("/proc", read_dir, read_file),
                    ("/dev/shm", handled, handled & (1 | 2 | 4 | 1 << 14)),
                ]
            for path, on_dir, on_file in rules:
                self._landlock_rule(ruleset, path, on_dir, on_file)
            if libc.syscall(_LANDLOCK_RESTRICT_SELF, ruleset, 0) != 0:
                self._landlock_refused(os.strerror(ctypes.get_errno()))
                return
        finally:
            os.close(ruleset)
        if viewed:
            self.report.notes.setdefault("filesystem", f"and Landlock ABI {abi}")
            return
        if abi >= 6 and not self.report.layers["pid"]:
            self.report.notes["pid"] += "; other processes cannot be signalled (Landlock)"
        why = self.report.notes.get("filesystem") or "no mount namespace"
        self.report.layers["filesystem"] = True
        self.report.notes["filesystem"] = (
            f"Landlock ABI {abi} only: the host's paths, read-only where the policy allows ({why})"
        )

    def _landlock_rule(self, ruleset: int, path: str, on_dir: int, on_file: int) -> None:
        try:
            fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
        except OSError:
            return  # not on this machine
        try:
            allowed = (
                on_dir
                if os.path.isdir(f"/proc/self/fd/{fd}") or (on_dir and os.path.isdir(path))
                else on_file
            )
            attr = struct.pack("=Qi", allowed, fd)
            self.libc.syscall(_LANDLOCK_ADD_RULE, ruleset, 1, ctypes.c_char_p(attr), 0)
        finally:
            os.close(fd)

    def _landlock_refused(self, why: str) -> None:
        """Only news where the mount view did not hold: then nothing limits files."""
        if not self.report.layers["filesystem"]:
            before = self.report.notes.get("filesystem") or "no mount namespace"
            self.report.notes["filesystem"] = (
                f"{before}; and Landlock is {why}"
                if why.startswith("not")
                else f"{before}; and Landlock refused: {why}"
            )

    # -- 6. syscalls -----------------------------------------------------------------------
    def filter_syscalls(self) -> None:
        if self.libc is None:
            self.report.refused(
                "syscalls", self.off or f"seccomp is Linux-only (this is {sys.platform})"
            )
            return
        arch = _arch()
        if arch is None:
            self.report.refused("syscalls", f"no syscall table for {os.uname().machine}")
            return
        program = seccomp_program(*arch)
        filters = (ctypes.c_ubyte * len(program)).from_buffer_copy(program)

        class SockFprog(ctypes.Structure):
            _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]

        fprog = SockFprog(len(program) // 8, ctypes.addressof(filters))
        self.libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
        if self.libc.prctl(PR_SET_SECCOMP, 2, ctypes.addressof(fprog), 0, 0) != 0:
            self.report.refused(
                "syscalls", f"seccomp refused the filter ({os.strerror(ctypes.get_errno())})"
            )
            return
        self.report.layers["syscalls"] = True

    def network_check(self) -> None:
        """The network layer holds in a namespace of our own (a loopback that is down,
        nothing else); without one, if the syscall filter refuses every new socket.
        Run after ``filter_syscalls``."""
        if self.namespaced:
            self.report.layers["network"] = True
        elif self.report.layers["syscalls"]:
            self.report.layers["network"] = True
            self.report.notes["network"] = (
                "no network namespace, but no new socket either (seccomp)"
            )


def seccomp_program(audit_arch: int, table: dict[str, int], foreign: int | None) -> bytes:
    """A classic BPF program: the wrong architecture is killed; a denied syscall fails
    with EPERM; clone with a namespace flag too; clone3 says ENOSYS (libc then uses
    clone, whose flags can be read)."""
    LD, JEQ, JGE, JSET, RET = 0x20, 0x15, 0x35, 0x45, 0x06
    ALLOW, KILL = 0x7FFF0000, 0x80000000
    EPERM, ENOSYS = 0x00050000 | errno.EPERM, 0x00050000 | errno.ENOSYS
    denied = [table[name] for name in DENIED_SYSCALLS if name in table]
    code: list[tuple] = [(LD, 0, 0, 4), (JEQ, 1, 0, audit_arch), (RET, 0, 0, KILL), (LD, 0, 0, 0)]
    if foreign is not None:
        code.append((JGE, "deny", 0, foreign))
    code += [(JEQ, "deny", 0, nr) for nr in denied]
    code += [
        (JEQ, "nosys", 0, table["clone3"]),
        (JEQ, 0, "allow", table["clone"]),
        (LD, 0, 0, 16),
        (JSET, "deny", 0, _NAMESPACE_FLAGS),
    ]
    labels = {"allow": len(code), "deny": len(code) + 1, "nosys": len(code) + 2}
    code += [(RET, 0, 0, ALLOW), (RET, 0, 0, EPERM), (RET, 0, 0, ENOSYS)]
    out = b""
    for index, (op, jt, jf, k) in enumerate(code):
        jt = labels[jt] - index - 1 if isinstance(jt, str) else jt
        jf = labels[jf] - index - 1 if isinstance(jf, str) else jf
        out += struct.pack("=HBBI", op, jt, jf, k)
    return out


def _syscall(name: str) -> int:
    arch = _arch()
    if arch is None:
        raise OSError(errno.ENOSYS, f"no syscall table for {os.uname().machine}")
    return arch[1][name]


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


def _write(path: str, text: str) -> None:
    with open(path, "w") as file:
        file.write(text)


def _is_host_root() -> bool:
    """Whether this process is the real root user (uid 0 outside any user namespace we
    made): read from our own uid map."""
    try:
        with open("/proc/self/uid_map") as file:
            for line in file:
                inside, outside, _ = (int(x) for x in line.split())
                if inside == os.getuid() and outside == 0:
                    return True
    except (OSError, ValueError):
        return os.getuid() == 0
    return False


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
