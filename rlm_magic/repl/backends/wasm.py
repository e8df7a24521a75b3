"""``RLM.sandbox = "wasm"``: model code runs in CPython compiled to WebAssembly
(Pyodide) inside a Deno process started with no network, no environment, no
subprocesses and reads of Pyodide's own files only. It works the same on Linux, macOS
and Windows, with or without user namespaces.

Deno comes from the ``wasm`` extra (``pip install 'rlm-magic[wasm]'``: the ``deno``
package ships its binary) or from PATH. Pyodide comes from the npm registry, fetched
once into ``RLM_WASM_CACHE`` (default ``~/.cache/rlm-magic/wasm``); every sandbox after
that starts from the cache with no network at all.

The kernel's side of the sandbox is the process sandbox's (``sandbox.repl``): the same
frames, limits and helper calls; only the launch differs (``WasmProcess``). The worker
inside is ``wasm_host/pyodide_worker.py`` around the process worker's code, sent over
the bridge in the first frame, so the package's folder is never readable from inside.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

from ...errors import SandboxError
from .. import bridge
from ..base import SandboxSettings
from ..sandbox.pipes import PipeReader, PipeWriter
from ..sandbox.process import CARRIED_LOAD_S, SandboxProcess
from . import sources

PYODIDE_VERSION = "314.0.8"  # as runner.js imports it
HOST = Path(__file__).with_name("wasm_host")
_RUNNER = HOST / "runner.js"
_PAGE = 2**16  # WebAssembly's page
_STDERR_KEPT = 4096  # of what Deno says when it fails
_START_S = 60.0  # for Deno to load Pyodide (under a second from the snapshot)
# What Deno's private writable memory may grow by past the WebAssembly cap, once Pyodide
# has loaded: JavaScript's own (typed arrays live outside that cap) and V8's heaps.
_BEYOND_CAP_MB = 256

INSTALL_DENO = "pip install 'rlm-magic[wasm]'"
# How Deno runs the sandbox: from the cache only, asking nothing, reading no config.
_DENO_RUN = ("run", "--quiet", "--no-prompt", "--cached-only", "--no-config", "--no-lock")
_fetch_lock = threading.Lock()
_fetched: set[str] = set()  # cache folders that hold Pyodide, in this process


def cache_dir() -> Path:
    """Where Deno keeps Pyodide (its DENO_DIR)."""
    configured = os.environ.get("RLM_WASM_CACHE")
    if configured:
        return Path(configured)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(Path.home(), ".cache")
    return Path(base) / "rlm-magic" / "wasm"


def deno_binary() -> str | None:
    """The Deno to run: the ``deno`` package's (the ``wasm`` extra), else one on PATH."""
    try:
        from deno import find_deno_bin

        found = str(find_deno_bin())
        if os.access(found, os.X_OK):
            return found
    except (ImportError, OSError, RuntimeError):
        pass
    return shutil.which("deno")


def unavailable() -> str | None:
    """Why this backend cannot run here, or None."""
    if deno_binary() is None:
        return f"Deno is not installed ({INSTALL_DENO})"
    return None


def _deno_environment() -> dict[str, str]:
    """Deno's whole environment: where its cache is, and nothing of the kernel's."""
    env = {
        "DENO_DIR": str(cache_dir()),
        "DENO_NO_UPDATE_CHECK": "1",
        "DENO_NO_PROMPT": "1",
        "NO_COLOR": "1",
    }
    if sys.platform == "win32":  # Windows' own, without which a process cannot start
        env.update({k: os.environ[k] for k in ("SYSTEMROOT", "SYSTEMDRIVE") if k in os.environ})
    return env


def fetch_pyodide(deno: str) -> None:
    """Bring Pyodide into the cache once (the only time Deno gets the network: the npm
    registry, or the mirror ``NPM_CONFIG_REGISTRY`` names). Blocking: call in a thread."""
    folder = str(cache_dir())
    with _fetch_lock:
        if folder in _fetched:
            return
        if _pyodide_folder().is_dir():
            _make_snapshot(deno)
            _fetched.add(folder)
            return
        # Installing, not sandboxing: no model code runs, and the network settings
        # (proxies, certificates, a registry mirror) are the kernel's.
        env = {**os.environ, **_deno_environment()}
        try:
            done = subprocess.run(
                [deno, "cache", "--no-config", "--no-lock", str(_RUNNER)],
                env=env,
                capture_output=True,
                timeout=300,
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise SandboxError(_cannot_fetch(str(exc))) from None
        if done.returncode != 0 or not _pyodide_folder().is_dir():
            said = [
                line.strip()
                for line in done.stderr.decode("utf-8", "replace").splitlines()
                if line.strip() and not line.strip().startswith(("at ", "Download"))
            ]
            raise SandboxError(_cannot_fetch(said[-1] if said else f"status {done.returncode}"))
        _make_snapshot(deno)
        _fetched.add(folder)


def _make_snapshot(deno: str) -> None:
    """Pyodide's memory once loaded, kept beside it: each sandbox then starts in half a
    second. No model code runs here; a sandbox without it loads Pyodide afresh."""
    if _snapshot().is_file():
        return
    try:
        subprocess.run(
            [
                deno,
                *_DENO_RUN,
                f"--allow-read={_pyodide_folder()},{HOST},{cache_dir()}",
                f"--allow-write={cache_dir()}",
                str(_RUNNER),
                "--make-snapshot",
                str(_snapshot()),
            ],
            env=_deno_environment(),
            cwd=str(HOST),
            capture_output=True,
            timeout=300,
        )
    except (OSError, subprocess.TimeoutExpired):
        pass  # sandboxes start without it, more slowly


def _snapshot() -> Path:
    return cache_dir() / f"pyodide-{PYODIDE_VERSION}.snapshot"


def _cannot_fetch(why: str) -> str:
    return (
        f"the wasm sandbox needs Pyodide {PYODIDE_VERSION}, which is not in {cache_dir()} "
        f"and could not be fetched from the npm registry ({why[:200]}). Offline: run "
        f"`python -m rlm_magic.repl.backends.wasm` on a machine that reaches the registry "
        f"and copy its {cache_dir()} here (or point RLM_WASM_CACHE at a copy); set "
        "NPM_CONFIG_REGISTRY to use a mirror"
    )


def _pyodide_folder() -> Path:
    return cache_dir() / "npm" / "registry.npmjs.org" / "pyodide" / PYODIDE_VERSION


def boot_frame() -> bytes:
    """The first frame a wasm sandbox reads: the worker's code, and the packages it is
    imported from (Pyodide imports files: empty ``__init__``s, not the package's)."""
    return sources.boot_frame(
        HOST / "pyodide_worker.py", "rlm_magic/__init__.py", "rlm_magic/repl/__init__.py"
    )


class WasmProcess(SandboxProcess):
    """A Deno process running Pyodide, its bridge over stdin and stdout."""

    # What result.isolation reports for this backend (pyodide_worker.LAYERS).
    LAYERS = ("webassembly", "filesystem", "network", "environment", "processes", "memory")
    REQUIRED_LAYERS = ("webassembly", "filesystem", "network", "environment", "processes")

    def __init__(
        self,
        process: subprocess.Popen[bytes],
        loop: asyncio.AbstractEventLoop,
        memory_mb: int | None = None,
    ):
        self.process = process
        self.memory_mb = memory_mb
        self.workdir = ""
        self.dead: str | None = None
        self.relays = False
        self.frame_size = 0
        assert process.stdout is not None and process.stdin is not None
        self.reader: PipeReader = PipeReader(process.stdout, loop, "rlm-wasm-out")  # type: ignore[assignment]
        self.pipe = PipeWriter(process.stdin, "rlm-wasm-in")
        self.said: list[bytes] = []  # the end of Deno's stderr
        threading.Thread(target=self._keep_stderr, name="rlm-wasm-err", daemon=True).start()

    def _keep_stderr(self) -> None:
        stderr = self.process.stderr
        assert stderr is not None
        kept = b""
        with stderr:
            for line in iter(lambda: stderr.readline(_STDERR_KEPT), b""):
                kept = (kept + line)[-_STDERR_KEPT:]
                self.said[:] = [kept]

    def init_fields(self, settings: SandboxSettings, isolate: bool) -> dict[str, Any]:
        return {}  # Deno was started confined: nothing for the worker to apply

    async def handshake(
        self, init: bytes, pickled: bytes, carried: tuple[bytes, ...] | None = None
    ) -> Any:
        self.pipe.write(boot_frame())
        self.pipe.write(init)
        self.pipe.write(bridge.pickle_frame_header(len(pickled)) + pickled)
        if carried is not None:
            self.pipe.write(bridge.pickle_frame_header(sum(map(len, carried)), bridge.DATA))
            for part in carried:
                self.pipe.write(part)
        try:
            report = await asyncio.wait_for(
                self.await_ready(carried is not None), _START_S + CARRIED_LOAD_S
            )
        except asyncio.TimeoutError:
            raise SandboxError(
                f"the wasm sandbox did not start within {_START_S + CARRIED_LOAD_S:g}s"
            ) from None
        except (asyncio.IncompleteReadError, ConnectionError) as exc:
            raise SandboxError(f"{await self.exit_reason()} ({exc})") from None
        if isinstance(report, dict) and isinstance(report.get("layers"), dict):
            capped = report["layers"]["memory"] = self.cap_memory()
            if not capped and isinstance(report.get("notes"), dict):
                report["notes"]["memory"] = (
                    "WebAssembly memory is capped (RLM.sandbox_memory_mb), JavaScript's "
                    "is not: no process limit could be set here"
                )
        return report

    def cap_memory(self) -> bool:
        """Cap the whole process's memory before any model code runs: the WebAssembly
        cap leaves JavaScript's out (``js.Uint8Array.new(2**30)``, a Web Worker's). On
        Linux, RLIMIT_DATA at what Deno holds once ready (its heaps and thread stacks,
        1.2 GB reserved, little of it touched) plus the cap and a margin; elsewhere the
        WebAssembly cap only. Whether the whole process's memory is capped."""
        if self.memory_mb is None or not sys.platform.startswith("linux"):
            return False
        import resource

        try:
            with open(f"/proc/{self.process.pid}/status") as status:
                held_kb = next(
                    int(line.split()[1]) for line in status if line.startswith("VmData:")
                )
            limit = held_kb * 1024 + (self.memory_mb + _BEYOND_CAP_MB) * 2**20
            resource.prlimit(self.process.pid, resource.RLIMIT_DATA, (limit, limit))
        except (OSError, StopIteration, ValueError):
            return False
        return True

    def write(self, data: bytes) -> None:
        self.pipe.write(data)
        self.check_unread(self.pipe.waiting())

    async def drained(self) -> None:
        await self.pipe.drained()

    def signal(self, signum: int) -> None:
        import signal as signals

        if signum == signals.SIGINT:
            self.pipe.write(bridge.INTERRUPT)  # reader.js raises it in Python, namespace kept
        else:
            self.kill()

    def kill(self) -> None:
        try:
            self.process.kill()
        except OSError:
            pass

    async def end(self) -> None:
        self.kill()
        self._close_pipes()
        try:
            await asyncio.wait_for(asyncio.to_thread(self.process.wait), 5)
        except asyncio.TimeoutError:
            pass

    def end_now(self) -> None:
        self.kill()
        self._close_pipes()
        try:
            self.process.wait(5)
        except subprocess.TimeoutExpired:
            pass

    def _close_pipes(self) -> None:
        """stdin once written, stdout now (with what was read of it); stderr at its end,
        by the thread that keeps it (``_keep_stderr``)."""
        self.pipe.close()
        self.reader.close()

    async def exit_reason(self) -> str:
        reason = await super().exit_reason()
        said = b"".join(self.said).decode("utf-8", "replace").strip().splitlines()
        return f"{reason}: {said[-1][:300]}" if said else reason


async def launch(secrets: tuple[str | None, ...], settings: SandboxSettings) -> WasmProcess:
    """Start a wasm sandbox (fetching Pyodide first, once); it waits for the handshake.
    Deno gets no environment of the kernel's, so no ``secrets`` can reach it."""
    deno = deno_binary()
    if deno is None:
        raise SandboxError(
            f"RLM.sandbox = 'wasm' needs Deno, which is not installed: {INSTALL_DENO}"
        )
    await asyncio.to_thread(fetch_pyodide, deno)
    memory_mb = settings.memory_mb or 4096
    pages = min(65536, max(256, memory_mb * 2**20 // _PAGE))  # wasm32: 4 GB at most
    command = [
        deno,
        *_DENO_RUN,
        f"--allow-read={_pyodide_folder()},{HOST},{_snapshot()}",
        # Denied outright, not only left out: remote imports are allowed by default.
        "--deny-import",
        "--deny-net",
        "--deny-env",
        "--deny-run",
        "--deny-ffi",
        "--deny-sys",
        "--deny-write",
        f"--v8-flags=--wasm-max-mem-pages={pages},--max-old-space-size={min(memory_mb, 1024)}",
        str(_RUNNER),
        str(_snapshot()),
    ]
    return WasmProcess(_start(command), asyncio.get_running_loop(), memory_mb)


def _start(command: list[str]) -> subprocess.Popen[bytes]:
    """Deno, in a session (or process group) of its own: the notebook's Ctrl-C and the
    kernel's interrupt are not the sandbox's."""
    flags: dict[str, Any] = (
        {"creationflags": subprocess.CREATE_NEW_PROCESS_GROUP}  # type: ignore[attr-defined]
        if sys.platform == "win32"
        else {"start_new_session": True}
    )
    try:
        return subprocess.Popen(
            command,
            env=_deno_environment(),
            cwd=str(HOST),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            **flags,
        )
    except OSError as exc:
        raise SandboxError(f"the wasm sandbox could not start: {exc}") from None


if __name__ == "__main__":  # python -m rlm_magic.repl.backends.wasm: fetch Pyodide now
    found = deno_binary()
    if found is None:
        sys.exit(f"Deno is not installed: {INSTALL_DENO}")
    fetch_pyodide(found)
    print(f"Pyodide {PYODIDE_VERSION} is in {cache_dir()}")
