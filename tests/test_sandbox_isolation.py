"""The isolation layers one at a time, and what happens where the OS refuses one.

These drive ``SandboxREPL`` directly (no model, no litellm), so they are fast; the
attacks through a real run are in test_sandbox_attacks.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from rlm_magic.repl import bridge, isolation

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux layers")
REPO = Path(__file__).resolve().parent.parent


def _sandboxed(code: str, before: str = "") -> dict:
    """Run ``code`` in a sandbox started by a fresh Python (which first runs
    ``before``); returns the step's output and ``result.isolation``."""
    script = "\n".join(
        [
            "import asyncio, json, sys, warnings",
            f"sys.path.insert(0, {str(REPO)!r})",
            "from rlm_magic.repl import isolation",
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
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.splitlines()[-1])


# Denies unshare (and clone with namespace flags), as a container's seccomp profile does.
_NO_USER_NAMESPACES = """
prog = isolation.seccomp_program(*isolation._arch()[:1], {
    k: v for k, v in isolation._arch()[1].items() if k in ("unshare", "clone", "clone3")},
    isolation._arch()[2])
libc = isolation._libc()
import ctypes
buf = (ctypes.c_ubyte * len(prog)).from_buffer_copy(prog)
class Fprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]
fprog = Fprog(len(prog) // 8, ctypes.addressof(buf))
libc.prctl(38, 1, 0, 0, 0)
assert libc.prctl(22, 2, ctypes.addressof(fprog), 0, 0) == 0
"""


@pytest.mark.skipif(isolation._arch() is None, reason="no syscall table here")
def test_where_the_os_refuses_user_namespaces_seccomp_and_landlock_still_hold(tmp_path):
    secret = tmp_path / "secret.txt"  # a file of the kernel's user, outside the policy
    secret.write_text("fake-0010")
    attempts = (
        "import os, socket\nfor attempt in (lambda: socket.socket(), "
        f"lambda: os.kill(os.getppid(), 0), lambda: open({str(secret)!r}).read()):\n"
        "    try:\n        attempt()\n        print('ALLOWED')\n"
        "    except OSError as e:\n        print(e.strerror)"
    )
    out = _sandboxed(attempts, before=_NO_USER_NAMESPACES)
    layers, notes = out["isolation"], out["isolation"]["notes"]
    assert not any(layers[name] for name in ("user", "pid", "processes"))
    assert "unshare() refused a user namespace" in notes["user"]
    assert layers["syscalls"] and layers["network"] and "seccomp" in notes["network"]
    lines = out["output"].splitlines()
    assert lines[0] == "Operation not permitted"  # no socket
    if layers["filesystem"]:  # Landlock: the kernel's files and processes out of reach
        assert "Landlock" in notes["filesystem"]
        assert lines[2] == "Permission denied"
        if "cannot be signalled" in notes["pid"]:
            assert lines[1] == "Operation not permitted"
    [warning] = out["warnings"]
    assert "\n" not in warning and "runs without user, pid" in warning
    assert "To fix:" in warning


def test_the_sandbox_sees_a_root_of_its_own():
    out = _sandboxed(
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
