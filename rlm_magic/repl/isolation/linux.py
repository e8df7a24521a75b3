"""Linux as the layers call it: constants from its headers, syscall numbers per
architecture, and libc through ctypes.

Standard library only: the sandbox worker imports this.
"""

from __future__ import annotations

import ctypes
import errno
import os

CLONE_NEWNS, CLONE_NEWCGROUP, CLONE_NEWUTS = 0x00020000, 0x02000000, 0x04000000
CLONE_NEWIPC, CLONE_NEWUSER = 0x08000000, 0x10000000
CLONE_NEWPID, CLONE_NEWNET, CLONE_NEWTIME = 0x20000000, 0x40000000, 0x00000080
# (clone's low byte is its exit signal, so CLONE_NEWTIME, clone3-only, is left out)
NAMESPACE_FLAGS = (
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
LANDLOCK_CREATE_RULESET, LANDLOCK_ADD_RULE, LANDLOCK_RESTRICT_SELF = 444, 445, 446
PR_SET_PDEATHSIG, PR_SET_DUMPABLE, PR_SET_SECCOMP = 1, 4, 22
PR_CAPBSET_DROP, PR_SET_SECUREBITS, PR_SET_NO_NEW_PRIVS, PR_CAP_AMBIENT = 24, 28, 38, 47
# NOROOT, NO_SETUID_FIXUP and KEEP_CAPS, each locked: root gains nothing on exec.
SECUREBITS = 0x01 | 0x02 | 0x04 | 0x08 | 0x20

# Syscall numbers per architecture, for the names the filter and the layers use.
X86_64 = dict(
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
    shmget=29,
    shmat=30,
    shmctl=31,
    shmdt=67,
    msgget=68,
    msgsnd=69,
    msgrcv=70,
    msgctl=71,
    semget=64,
    semop=65,
    semtimedop=220,
    semctl=66,
    sendto=44,
    recvfrom=45,
    sendmsg=46,
    recvmsg=47,
    sendmmsg=307,
    recvmmsg=299,
)
AARCH64 = dict(
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
    shmget=194,
    shmat=196,
    shmctl=195,
    shmdt=197,
    msgget=186,
    msgsnd=189,
    msgrcv=188,
    msgctl=187,
    semget=190,
    semop=193,
    semtimedop=192,
    semctl=191,
    sendto=206,
    recvfrom=207,
    sendmsg=211,
    recvmsg=212,
    sendmmsg=269,
    recvmmsg=243,
)
# (audit arch, syscall table, first number of a foreign ABI sharing the arch, or None)
Arch = tuple[int, dict[str, int], int | None]
ARCHES: dict[str, Arch] = {
    "x86_64": (0xC000003E, X86_64, 0x40000000),
    "aarch64": (0xC00000B7, AARCH64, None),
}


def load_libc() -> ctypes.CDLL:
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


def check(result: int, what: str) -> None:
    if result != 0:
        code = ctypes.get_errno()
        raise OSError(code, f"{what}: {os.strerror(code)}")


def current_arch() -> Arch | None:
    return ARCHES.get(os.uname().machine)


def syscall_number(name: str) -> int:
    arch = current_arch()
    if arch is None:
        raise OSError(errno.ENOSYS, f"no syscall table for {os.uname().machine}")
    return arch[1][name]


def is_host_root() -> bool:
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
