"""The isolation layers one at a time, and what happens where the OS refuses one.

These drive ``SandboxREPL`` directly (no model, no litellm), so they are fast; the
attacks through a real run are in test_sandbox_attacks.py."""

from __future__ import annotations

import json
import os
import re
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from rlm_magic.repl import bridge, isolation
from rlm_magic.repl.isolation import linux, policy, syscalls
from rlm_magic.repl.sandbox import environment

from .support.sandboxed import NO_USER_NAMESPACES, filter_answer, sandboxed

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux layers")
REPO = Path(__file__).resolve().parent.parent


@pytest.mark.skipif(isolation._arch() is None, reason="no syscall table here")
def test_where_the_os_refuses_user_namespaces_seccomp_and_landlock_still_hold(tmp_path):
    secret = tmp_path / "secret.txt"  # a file of the kernel's user, outside the policy
    secret.write_text("fake-0010")
    attempts = (
        "import ctypes, os, socket, subprocess\n"
        "open('run.sh', 'w').write('#!/bin/sh\\n')\nos.chmod('run.sh', 0o755)\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        "def shared_memory():  # SysV: without a user namespace, the host's\n"
        "    if libc.shmget(0, 1 << 20, 0o1600) < 0:\n"
        "        raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))\n"
        "for attempt in (lambda: socket.socket(), "
        f"lambda: os.kill(os.getppid(), 0), lambda: open({str(secret)!r}).read(), "
        "lambda: subprocess.run(['./run.sh']), shared_memory):\n"
        "    try:\n        attempt()\n        print('ALLOWED')\n"
        "    except OSError as e:\n        print(e.strerror)"
    )
    out = sandboxed(attempts, before=NO_USER_NAMESPACES)
    layers, notes = out["isolation"], out["isolation"]["notes"]
    assert not any(layers[name] for name in ("user", "pid", "processes"))
    assert "unshare() refused a user namespace" in notes["user"]
    assert layers["syscalls"] and layers["network"] and "seccomp" in notes["network"]
    lines = out["output"].splitlines()
    assert lines[0] == "Operation not permitted"  # no socket
    assert lines[4] == "Operation not permitted"  # no SysV shared memory
    if layers["filesystem"]:  # Landlock: the kernel's files and processes out of reach
        assert "Landlock" in notes["filesystem"]
        assert lines[2] == "Permission denied"
        assert lines[3] == "Permission denied"  # nothing it writes runs as a program
        if "cannot be signalled" in notes["pid"]:
            assert lines[1] == "Operation not permitted"
    [warning] = out["warnings"]
    assert "\n" not in warning and "runs without user, pid" in warning
    assert "To fix:" in warning


def test_the_sandbox_sees_a_root_of_its_own():
    out = sandboxed(
        "import os\nprint(sorted(os.listdir('/')), os.getpid(), "
        "os.access('/usr', os.W_OK), os.access('.', os.W_OK))"
    )
    if not out["isolation"]["filesystem"]:
        pytest.skip(f"no filesystem view here: {out['isolation']['notes']}")
    top, pid, usr_writable, work_writable = out["output"].rsplit(" ", 3)
    assert set(eval(top)) <= {
        "bin",
        "dev",
        "etc",
        "lib",
        "lib32",
        "lib64",
        "libx32",
        "proc",
        "sbin",
        "tmp",
        "usr",
        *(
            p.split("/")[1]
            for p in isolation.policy_for(
                "/tmp/x", memory_mb=None, max_processes=8, disk_mb=1, host_maps_ids=False
            ).read_only
        ),
    }
    assert pid == "1" and usr_writable == "False" and work_writable == "True"


def test_the_policy_binds_installed_packages_but_not_the_notebook_folder(monkeypatch, tmp_path):
    notebook = tmp_path / "notebook"
    packages = tmp_path / "lib" / "site-packages"
    notebook.mkdir()
    packages.mkdir(parents=True)
    monkeypatch.setattr(sys, "path", [str(notebook), str(packages), *sys.path])
    policy = isolation.policy_for(
        "/tmp/x", memory_mb=None, max_processes=8, disk_mb=1, host_maps_ids=False
    )
    assert str(packages) in policy.read_only
    assert str(notebook) not in policy.read_only and str(tmp_path) not in policy.read_only
    assert os.path.dirname(os.path.dirname(bridge.__file__)) in policy.read_only


def test_a_frame_counts_its_values_not_the_commas_in_its_text_and_a_hand_made_one_counts_high():
    text = 'a, "b" [c] {d}' * 1000  # commas, quotes and brackets inside a string
    framed = bridge.frame({"op": "x", "items": [text, 1, [2, {"k": None}]]})
    assert bridge.count_values(framed[bridge.HEADER.size :]) < 20
    assert json.loads(framed[bridge.HEADER.size :])["items"][0] == text
    assert bridge.count_values(b'{"op": "x", "v": [' + b"{}," * 1000 + b"{}]}") >= 1002
    with pytest.raises(bridge.BridgeError, match="JSON values"):
        bridge.check_body(b'{"op": "x", "v": [' + b"[]," * bridge.MAX_VALUES + b"[]]}")
    with pytest.raises(bridge.BridgeError, match="not ASCII"):
        bridge.check_body('{"op": "caf\u00e9"}'.encode())


async def test_a_worker_whose_code_cannot_be_read_fails_the_start_in_one_line(
    monkeypatch, tmp_path
):
    from rlm_magic.repl import sandbox
    from rlm_magic.repl.sandbox import process

    monkeypatch.setattr(process, "_WORKER", str(tmp_path / "private" / "worker.py"))
    repl = sandbox.SandboxREPL("c", {})
    await repl.start()
    with pytest.raises(sandbox.SandboxError, match="cannot read its own code") as caught:
        await repl.run("x = 1")
    assert "\n" not in str(caught.value)
    await repl.aclose()


# -- the syscall filter, read as the kernel runs it ---------------------------------------
_NEVER = (
    "listmount",
    "statmount",
    "file_getattr",
    "shmget",
    "msgget",
    "memfd_create",
    "io_uring_setup",
    "io_uring_enter",
    "io_uring_register",
    "bpf",
    "ptrace",
    "keyctl",
    "userfaultfd",
    "unshare",
    "setns",
    "mount",
)


def _jumps_stay_inside(program: bytes) -> None:
    """Every jump lands on an instruction of the program, forward, and it ends in a
    return: what the kernel's checker demands (conditional offsets are 8 bits)."""
    code = [struct.unpack_from("=HBBI", program, at) for at in range(0, len(program), 8)]
    assert 0 < len(code) <= 4096 and code[-1][0] == syscalls.RET
    known = {syscalls.LD, syscalls.JA, syscalls.JEQ, syscalls.JGT, syscalls.JGE, syscalls.JSET}
    for pc, (op, jt, jf, k) in enumerate(code):
        assert op in known | {syscalls.RET}, (pc, op)
        if op == syscalls.JA:
            assert pc + 1 + k < len(code), pc
        elif op != syscalls.LD and op != syscalls.RET:
            assert pc + 1 + max(jt, jf) < len(code), pc
        elif op == syscalls.LD:
            assert k in (0, 4) or (k - 16) % 8 == 0 and 16 <= k < 64, (pc, k)


@pytest.mark.parametrize("name", sorted(linux.ARCHES))
def test_the_filter_allows_the_allow_list_and_refuses_every_other_number(name):
    arch = linux.ARCHES[name]
    program = isolation.seccomp_program(arch)
    _jumps_stay_inside(program)
    allowed = {arch.table[n] for n in policy.ALLOWED_SYSCALLS if n in arch.table}
    ruled = {arch.table[n] for n in ("clone", "clone3", "socketpair", "setsockopt", "fcntl")}
    ruled |= {arch.table[n] for n in policy.OOB_FLAG_ARGUMENT}
    for nr in range(linux.NEWEST_KNOWN + 1):
        if nr not in ruled:
            expected = syscalls.ALLOW if nr in allowed else syscalls.EPERM
            assert filter_answer(program, nr, arch=arch.audit) == expected, nr
    for never in _NEVER:
        assert filter_answer(program, arch.table[never], arch=arch.audit) == syscalls.EPERM, never
    # Newer than the tables: as on a kernel without it, so that libc falls back.
    for newer in (linux.NEWEST_KNOWN + 1, 1000, 0x3FFFFFFF):
        assert filter_answer(program, newer, arch=arch.audit) == syscalls.ENOSYS
    assert filter_answer(program, arch.table["read"], arch=0x40000003) == syscalls.KILL  # i386
    if arch.foreign is not None:  # x32: the same arch, numbers from 0x40000000
        read = arch.foreign | arch.table["read"]
        assert filter_answer(program, read, arch=arch.audit) == syscalls.EPERM


@pytest.mark.parametrize("name", sorted(linux.ARCHES))
def test_the_filter_reads_the_arguments_of_the_calls_it_allows_only_in_part(name):
    arch = linux.ARCHES[name]
    program = isolation.seccomp_program(arch)

    def answer(call: str, *args: int) -> str:
        k = filter_answer(program, arch.table[call], args, arch.audit)
        return {syscalls.ALLOW: "allow", syscalls.EPERM: "EPERM", syscalls.ENOSYS: "ENOSYS"}[k]

    threads = 0x3D0F00  # what glibc's pthread_create passes
    assert answer("clone", threads) == answer("clone", 0x11) == "allow"
    for flag in (linux.CLONE_NEWUSER, linux.CLONE_NEWNS, linux.CLONE_NEWNET, linux.CLONE_NEWPID):
        assert answer("clone", threads | flag) == "EPERM"
    assert answer("clone3") == "ENOSYS"
    assert answer("socketpair", 1, 1) == "allow"  # AF_UNIX
    assert answer("socketpair", 2, 1) == answer("socketpair", 30, 1) == "EPERM"  # INET, TIPC
    for call, index in policy.OOB_FLAG_ARGUMENT.items():
        flags = [0] * 6
        assert answer(call, *flags) == "allow"
        flags[index] = 0x40 | 0x1  # MSG_DONTWAIT | MSG_OOB
        assert answer(call, *flags) == "EPERM", call
    for option in (7, 8, 32, 33):  # SO_SNDBUF, SO_RCVBUF, SO_SNDBUFFORCE, SO_RCVBUFFORCE
        assert answer("setsockopt", 3, 1, option) == "EPERM"
        assert answer("setsockopt", 3, 6, option) == "allow"  # another level's option 7
    assert answer("setsockopt", 3, 1, 9) == "allow"  # SO_KEEPALIVE
    assert answer("fcntl", 3, 1031) == "EPERM"  # F_SETPIPE_SZ
    assert answer("fcntl", 3, 1032) == answer("fcntl", 3, 4) == "allow"  # F_GETPIPE_SZ, F_SETFL


def test_an_allow_list_of_lone_numbers_makes_a_long_filter_whose_jumps_are_all_valid():
    # Every other number up to the newest: no two make a range, and the program is
    # several times longer than a conditional jump (8 bits) can span.
    table = {f"call{n}": n for n in range(linux.NEWEST_KNOWN + 1)}
    arch = linux.Arch(0xC000003E, table, None)
    allowed = tuple(f"call{n}" for n in range(0, linux.NEWEST_KNOWN + 1, 2))
    program = isolation.seccomp_program(arch, allowed=allowed)
    assert len(program) // 8 > 3 * 255
    _jumps_stay_inside(program)
    for nr in range(linux.NEWEST_KNOWN + 1):
        expected = syscalls.ALLOW if nr % 2 == 0 else syscalls.EPERM
        assert filter_answer(program, nr, arch=arch.audit) == expected, nr


def test_the_never_list_is_refused_and_every_name_is_a_syscall_of_some_table():
    assert set(_NEVER) <= set(policy.DENIED_SYSCALLS)
    assert not set(policy.DENIED_SYSCALLS) & set(policy.ALLOWED_SYSCALLS)
    names = {*policy.ALLOWED_SYSCALLS, *policy.DENIED_SYSCALLS, *policy.OOB_FLAG_ARGUMENT}
    assert names <= {*linux.X86_64, *linux.AARCH64, "ipc"}  # (ipc: neither has it)
    assert max(linux.X86_64.values()) == max(linux.AARCH64.values()) == linux.NEWEST_KNOWN
    # aarch64 has only the generic calls: each legacy one it lacks has its successor.
    successor = {
        "access": "faccessat",
        "alarm": "setitimer",
        "chmod": "fchmodat",
        "chown": "fchownat",
        "creat": "openat",
        "dup2": "dup3",
        "epoll_create": "epoll_create1",
        "epoll_wait": "epoll_pwait",
        "eventfd": "eventfd2",
        "fork": "clone",
        "futimesat": "utimensat",
        "getdents": "getdents64",
        "getpgrp": "getpgid",
        "inotify_init": "inotify_init1",
        "lchown": "fchownat",
        "link": "linkat",
        "lstat": "newfstatat",
        "mkdir": "mkdirat",
        "mknod": "mknodat",
        "open": "openat",
        "pause": "rt_sigsuspend",
        "pipe": "pipe2",
        "poll": "ppoll",
        "readlink": "readlinkat",
        "rename": "renameat",
        "rmdir": "unlinkat",
        "select": "pselect6",
        "signalfd": "signalfd4",
        "stat": "newfstatat",
        "symlink": "symlinkat",
        "time": "clock_gettime",
        "unlink": "unlinkat",
        "utime": "utimensat",
        "utimes": "utimensat",
        "vfork": "clone",
        "arch_prctl": None,  # x86 only
    }
    lacking = {n for n in policy.ALLOWED_SYSCALLS if n not in linux.AARCH64}
    assert lacking == set(successor)
    assert all(s is None or s in linux.AARCH64 for s in successor.values())


@pytest.mark.parametrize(
    "header, table",
    [
        ("/usr/include/x86_64-linux-gnu/asm/unistd_64.h", linux.X86_64),
        ("/usr/include/asm-generic/unistd.h", linux.AARCH64),  # aarch64's own table
    ],
)
def test_the_syscall_tables_agree_with_the_kernels_headers(header, table):
    if not os.path.exists(header):
        pytest.skip(f"no {header} here")
    text = Path(header).read_text()
    numbers = {
        {"fstatat": "newfstatat"}.get(m[2], m[2]): int(m[3])
        for m in re.finditer(r"#define __NR(3264)?_(\w+)\s+(\d+)", text)
    }
    known = {name: nr for name, nr in table.items() if name in numbers}
    assert known == {name: numbers[name] for name in known}
    # The headers may be older than the tables: what they lack is newer than they are.
    newest = max(numbers[n] for n in known)
    assert all(nr > newest for name, nr in table.items() if name not in numbers)


_PROBES = """
import ctypes, errno, json, os, socket, subprocess, sys, threading
from rlm_magic.repl.isolation import Policy
from rlm_magic.repl.isolation.confinement import Confinement
from rlm_magic.repl.isolation.syscalls import filter_syscalls
confinement = Confinement(Policy(workdir='.'))
filter_syscalls(confinement)
assert confinement.report.layers['syscalls'], confinement.report
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
def call(nr, *args):
    ctypes.set_errno(0)
    ok = libc.syscall(nr, *args) >= 0
    return 'ALLOWED' if ok else errno.errorcode[ctypes.get_errno()]
def attempt(f):
    try:
        f()
        return 'ALLOWED'
    except OSError as e:
        return errno.errorcode[e.errno]
a, b = socket.socketpair()
r, w = os.pipe()
out = {
    'statmount': call(457, 0, 0, 0, 0), 'listmount': call(458, 0, 0, 0, 0),
    'file_getattr': call(468, 0, 0, 0, 0, 0), 'newest_plus_one': call(470), 'far_newer': call(1000),
    'so_sndbuf': attempt(lambda: a.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 2**22)),
    'so_rcvbuf': attempt(lambda: a.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 2**22)),
    'f_setpipe_sz': attempt(lambda: __import__('fcntl').fcntl(w, 1031, 2**20)),
    'inet_pair': attempt(lambda: socket.socketpair(socket.AF_INET)),
    'oob': attempt(lambda: a.send(b'x', socket.MSG_OOB)),
}
def honest():
    t = threading.Thread(target=lambda: None); t.start(); t.join()
    a.sendall(b'ping'); assert b.recv(4) == b'ping'
    os.write(w, b'x'); assert os.read(r, 1) == b'x'
    assert subprocess.run(['true']).returncode == 0
    a.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
out['honest'] = attempt(honest)
print(json.dumps(out))
"""


@pytest.mark.skipif(linux.current_arch() is None, reason="no syscall table here")
def test_on_this_kernel_newer_syscalls_and_bigger_buffers_are_refused_and_honest_calls_pass():
    done = subprocess.run(
        [sys.executable, "-c", _PROBES],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {
        "statmount": "EPERM",
        "listmount": "EPERM",
        "file_getattr": "EPERM",
        "newest_plus_one": "ENOSYS",
        "far_newer": "ENOSYS",
        "so_sndbuf": "EPERM",
        "so_rcvbuf": "EPERM",
        "f_setpipe_sz": "EPERM",
        "inet_pair": "EPERM",
        "oob": "EPERM",
        "honest": "ALLOWED",
    }


def test_the_security_guide_lists_exactly_the_environment_the_sandbox_gets(monkeypatch, tmp_path):
    guide = (REPO / "docs" / "guides" / "security.md").read_text()
    [bullet] = [
        block for block in guide.split("\n- ") if block.startswith("**An environment allow-list**")
    ]
    listed = set(re.findall(r"`([A-Z][A-Z_]+)`", bullet.split("and only the names")[0]))
    assert listed == {*environment.ENVIRONMENT_ALLOWED, "PATH", "HOME", "TMPDIR"}
    for name in (*environment.ENVIRONMENT_ALLOWED, "TERM", "COLORTERM", "PYTHONPATH", "USER"):
        monkeypatch.setenv(name, "x")
    seen = environment.sandbox_environment((), str(tmp_path))
    assert set(seen) == listed
