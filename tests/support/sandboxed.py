"""Sandboxes started by a fresh Python, for tests that must change that Python first (a
seccomp filter of a container's that refuses user namespaces), and the syscall filter
run as the kernel runs it, for tests that read it on every architecture."""

from __future__ import annotations

import json
import struct
import subprocess
import sys
from pathlib import Path

from rlm_magic.repl.isolation import syscalls

REPO = Path(__file__).resolve().parent.parent.parent

# Denies unshare (and clone with namespace flags), as a container's seccomp profile does.
NO_USER_NAMESPACES = """
import ctypes, struct
from rlm_magic.repl import isolation
from rlm_magic.repl.isolation import linux
table = linux.current_arch().table
op = lambda code, jt, jf, k: struct.pack('=HBBI', code, jt, jf, k)
EPERM, ENOSYS, ALLOW = 0x50001, 0x50026, 0x7FFF0000
prog = b''.join([
    op(0x20, 0, 0, 0),
    op(0x15, 0, 1, table['unshare']), op(0x06, 0, 0, EPERM),
    op(0x15, 0, 1, table['clone3']), op(0x06, 0, 0, ENOSYS),
    op(0x15, 0, 3, table['clone']), op(0x20, 0, 0, 16),
    op(0x45, 0, 1, linux.NAMESPACE_FLAGS), op(0x06, 0, 0, EPERM),
    op(0x06, 0, 0, ALLOW),
])
libc = isolation._libc()
buf = (ctypes.c_ubyte * len(prog)).from_buffer_copy(prog)
class Fprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]
fprog = Fprog(len(prog) // 8, ctypes.addressof(buf))
libc.prctl(38, 1, 0, 0, 0)
assert libc.prctl(22, 2, ctypes.addressof(fprog), 0, 0) == 0
"""


def sandboxed(code: str, before: str = "", timeout: float = 60) -> dict:
    """Run ``code`` in a sandbox started by a fresh Python (which first runs
    ``before``); returns the step's output and ``result.isolation``."""
    script = "\n".join(
        [
            "import asyncio, json, sys, warnings",
            f"sys.path.insert(0, {str(REPO)!r})",
            before,
            "from rlm_magic.repl.sandbox import SandboxREPL",
            "async def main():",
            "    repl = SandboxREPL('ctx', {})",
            "    await repl.start()",
            f"    output = await repl.run({code!r})",
            "    await repl.aclose()",
            "    return {'output': output.as_text(), 'isolation': repl.isolation}",
            "with warnings.catch_warnings(record=True) as caught:",
            "    warnings.simplefilter('always')",
            "    out = asyncio.run(main())",
            "out['warnings'] = [str(w.message) for w in caught]",
            "print(json.dumps(out))",
        ]
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=timeout
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.splitlines()[-1])


def filter_answer(program: bytes, nr: int, args: tuple[int, ...] = (), arch: int = 0) -> int:
    """What a seccomp filter answers for one call: classic BPF run as seccomp runs it,
    on a seccomp_data of (nr, arch, ip, args)."""
    data = struct.pack("=IIQ6Q", nr & 0xFFFFFFFF, arch, 0, *args, *[0] * (6 - len(args)))
    code = [struct.unpack_from("=HBBI", program, at) for at in range(0, len(program), 8)]
    a, pc = 0, 0
    while True:
        op, jt, jf, k = code[pc]
        if op == syscalls.RET:
            return k
        if op == syscalls.LD:
            a, pc = struct.unpack_from("=I", data, k)[0], pc + 1
        elif op == syscalls.JA:
            pc += 1 + k
        else:
            taken = {
                syscalls.JEQ: a == k,
                syscalls.JGT: a > k,
                syscalls.JGE: a >= k,
                syscalls.JSET: bool(a & k),
            }[op]
            pc += 1 + (jt if taken else jf)
