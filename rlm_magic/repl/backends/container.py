"""``RLM.sandbox = "container"``: model code runs in the process worker (real threads,
real subprocesses) inside a Docker or Podman container: no network, a read-only root
with a tmpfs ``/tmp`` as its working folder, memory and process limits of the
container's cgroups, an unprivileged user with no capabilities, and none of the
kernel's environment. The container is the isolation: the worker applies no layer of
its own, and reports the container's as it sees them from inside.

The runtime is ``RLM_CONTAINER_RUNTIME`` (podman or docker), else the first of them that
runs a container here; the image is ``RLM_CONTAINER_IMAGE`` (default
``localhost/rlm-sandbox``: a Debian with python3, built locally by
``container_host/build_image.sh``; no registry is used). The worker's code is not in the
image: it is sent in the first frame (as the wasm sandbox's), never mounted.

The bridge is the container's stdin and stdout (``-i``), read and written by threads
(``sandbox.pipes``). A step is stopped by an interrupt frame that the worker turns into
SIGINT on its main thread (the namespace is kept); a container that does not stop is
killed with ``<runtime> kill`` and removed with ``<runtime> rm -f``.

The runtime's client gets none of the kernel's environment either (``_CLIENT_ENVIRONMENT``:
where its configuration, storage and daemon are), so a ``containers.conf`` that passes
the client's variables on has none of the kernel's to pass. Its pid 1, a supervisor,
says how the worker ended on stderr under a token of this launch that model code never
holds (``stream_worker.run``): the kernel believes no other such line, so model code
cannot make it tell the user the memory limit killed a sandbox it killed itself.

Why one module: the container's command, its client's environment and the process that
runs it are one contract with ``stream_worker`` (the boot frames, the exit line), read
together when either side changes.
"""

from __future__ import annotations

import asyncio
import os
import secrets as tokens
import shutil
import signal as signals
import subprocess
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

from ...errors import SandboxError
from .. import bridge
from ..base import SandboxSettings
from ..sandbox import pipes
from ..sandbox.process import CARRIED_LOAD_S, SandboxProcess
from . import sources

RUNTIMES = ("podman", "docker")
DEFAULT_IMAGE = "localhost/rlm-sandbox"
BUILD_IMAGE = f"bash {Path(__file__).with_name('container_host') / 'build_image.sh'}"
USER = "65534:65534"  # nobody
LABEL = "rlm-magic.sandbox"  # on every sandbox container: `podman ps -a --filter label=...`
HOST = Path(__file__).with_name("container_host")
EXIT_MARK = "rlm-sandbox exit:"  # stream_worker.EXIT_MARK: how the worker ended
# From the first byte written to 'ready': a container start, and the carried variables'
# load, which has its own limit inside this one.
HANDSHAKE_S = 60 + CARRIED_LOAD_S
_STDERR_KEPT = 4096
_GRACE_S = 0.5  # for a container to end at its bridge's end, before it is killed
_PROXIES = ("HTTP_PROXY", "HTTPS_PROXY", "FTP_PROXY", "NO_PROXY", "ALL_PROXY")
# The kernel's variables the runtime's client gets: where it finds its programs, its
# configuration, storage and daemon (podman, docker; Windows' own). No others: podman's
# containers.conf may hand the client's environment to the container (env_host, env).
_CLIENT_ENVIRONMENT = (
    *("PATH", "HOME", "TMPDIR", "DBUS_SESSION_BUS_ADDRESS"),
    *("XDG_RUNTIME_DIR", "XDG_CONFIG_HOME", "XDG_DATA_HOME"),
    *("CONTAINERS_CONF", "CONTAINERS_CONF_OVERRIDE", "CONTAINERS_STORAGE_CONF"),
    *("CONTAINERS_REGISTRIES_CONF", "REGISTRIES_CONFIG_PATH", "CONTAINER_HOST"),
    *("CONTAINER_CONNECTION", "CONTAINER_SSHKEY", "STORAGE_DRIVER", "STORAGE_OPTS"),
    *("DOCKER_HOST", "DOCKER_CONFIG", "DOCKER_CONTEXT", "DOCKER_CERT_PATH"),
    *("DOCKER_TLS_VERIFY", "DOCKER_API_VERSION"),
    *("SYSTEMROOT", "SYSTEMDRIVE", "WINDIR", "USERPROFILE", "APPDATA", "LOCALAPPDATA"),
    *("PROGRAMDATA", "TEMP", "TMP", "COMSPEC", "PATHEXT"),
)

# The container's command: read the first frame (the worker's code) from stdin and run
# stream_worker.run with it. Nothing else of the package is in the container.
BOOT = """\
import json, os, struct, sys, types
def exactly(n):
    data = bytearray()
    while len(data) < n:
        chunk = os.read(0, n - len(data))
        if not chunk:
            raise SystemExit(1)
        data += chunk
    return bytes(data)
_, length = struct.unpack(">cQ", exactly(9))
files = json.loads(exactly(length))["files"]
module = sys.modules["stream_worker"] = types.ModuleType("stream_worker")
module.__file__ = "/rlm/stream_worker.py"
exec(compile(files.pop("stream_worker.py"), module.__file__, "exec"), module.__dict__)
module.run(files)
"""


@dataclass(frozen=True)
class Runtime:
    """A container runtime that runs the sandbox here."""

    name: str  # podman or docker
    binary: str
    flags: tuple[str, ...] = ()  # what this machine needs besides ours (--runtime=runc)


_found: dict[tuple[str, str], Runtime | str] = {}
_found_lock = threading.Lock()


def image() -> str:
    return os.environ.get("RLM_CONTAINER_IMAGE") or DEFAULT_IMAGE


def runtime() -> Runtime | str:
    """The runtime to use, or why none works (one line naming the command that fixes
    it). Tried once per runtime and image, by starting a container: blocking."""
    asked = os.environ.get("RLM_CONTAINER_RUNTIME", "")
    key = (asked, image())
    with _found_lock:
        if key not in _found:
            _found[key] = _find(asked, key[1])
        return _found[key]


def unavailable() -> str | None:
    """Why this backend cannot run here, or None."""
    found = runtime()
    return found if isinstance(found, str) else None


def _find(asked: str, image: str) -> Runtime | str:
    if asked and asked not in RUNTIMES:
        return f"RLM_CONTAINER_RUNTIME must be one of {', '.join(RUNTIMES)}, not {asked!r}"
    reasons = []
    for name in (asked,) if asked else RUNTIMES:
        if binary := shutil.which(name):
            found = _try(Runtime(name, binary), image)
            if isinstance(found, Runtime):
                return found
            reasons.append(found)
    if reasons:
        return reasons[0]
    package = "podman" if not asked or asked == "podman" else "docker.io"
    return f"no container runtime is installed: apt-get install -y {package}"


def _try(found: Runtime, image: str) -> Runtime | str:
    """``found`` if it starts a sandbox container of ``image``, else why not."""
    try:
        inspected = _run([found.binary, "image", "inspect", image])
        said = _last_line(inspected.stderr)
        missing = any(words in said.lower() for words in ("no such image", "image not known"))
        if inspected.returncode != 0 and not missing:
            fix = "start dockerd" if found.name == "docker" else "podman info says why"
            return f"{found.name} does not work here ({said[:150]}): {fix}"
        if inspected.returncode != 0:
            build = f"RLM_CONTAINER_RUNTIME={found.name} {BUILD_IMAGE}"
            if image != DEFAULT_IMAGE:
                build = f"RLM_CONTAINER_IMAGE={image} {build}"
            return f"the image {image} is not in {found.name}'s storage: {build}"
        tried = []
        # crun refuses cgroups v1 in hybrid mode; runc, if installed, does not.
        variants: list[tuple[str, ...]] = [()]
        if found.name == "podman" and shutil.which("runc"):
            variants.append(("--runtime=runc",))
        for flags in variants:
            candidate = Runtime(found.name, found.binary, flags)
            probe = _command(candidate, f"rlm-probe-{tokens.token_hex(4)}", _PROBE, "print(6*7)")
            done = _run(probe)
            if done.stdout.strip() == b"42":
                return candidate
            tried.append(_last_line(done.stderr))
        return f"{found.name} cannot start the sandbox's container here: {tried[-1][:200]}"
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"{found.name} does not work here: {exc}"


_PROBE = SandboxSettings(memory_mb=64, disk_mb=1, max_processes=8)


def client_environment() -> dict[str, str]:
    """The runtime client's whole environment (``_CLIENT_ENVIRONMENT``)."""
    return {name: os.environ[name] for name in _CLIENT_ENVIRONMENT if name in os.environ}


def _run(command: list[str]) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        command,
        capture_output=True,
        stdin=subprocess.DEVNULL,
        timeout=60,
        env=client_environment(),
    )


def _last_line(said: bytes) -> str:
    lines = [line.strip() for line in said.decode("utf-8", "replace").splitlines()]
    return next((line for line in reversed(lines) if line), "no reason given")


# Every sandbox's: no network, a read-only root, no capabilities; an environment of its
# own only; the bridge's bytes not logged to disk.
_FIXED = (
    "run --rm -i --pull=never --network=none --read-only --workdir=/tmp --cap-drop=ALL "
    "--security-opt=no-new-privileges --ipc=private --hostname=sandbox --log-driver=none "
    "--env=PATH=/usr/local/bin:/usr/bin:/bin --env=HOME=/tmp --env=TMPDIR=/tmp --env=LANG=C.UTF-8"
).split()


def _command(found: Runtime, name: str, settings: SandboxSettings, code: str) -> list[str]:
    """``<runtime> run`` of the sandbox: every limit on the command line, none of the
    kernel's environment (the runtime's client gets it; the container does not)."""
    command = [
        found.binary,
        *_FIXED,
        f"--name={name}",
        f"--label={LABEL}",
        f"--tmpfs=/tmp:rw,nosuid,nodev,noexec,mode=1777,size={max(1, settings.disk_mb)}m",
        f"--user={USER}",
        f"--pids-limit={settings.max_processes}",
        *found.flags,
    ]
    if settings.memory_mb:
        command += [f"--memory={settings.memory_mb}m", f"--memory-swap={settings.memory_mb}m"]
    if found.name == "podman":
        # Podman's own defaults: a tmpfs on /tmp, /run and /var/tmp under --read-only, the
        # client's proxy variables in the container, containers.conf's variables and the
        # client's (env, env_host), and rlimits its runtime (our child) may not raise past
        # ours. --unsetenv-all drops podman's and the image's; ours (--env) stay.
        command += ["--read-only-tmpfs=false", "--http-proxy=false", *_ulimits()]
        command += ["--env-host=false", "--unsetenv-all"]
    else:
        # The docker client adds the proxies of its config.json unless they are set.
        command += [f"--env={var}=" for name in _PROXIES for var in (name, name.lower())]
    return [*command, image(), "python3", "-I", "-c", code]


def _ulimits() -> list[str]:
    """Ours (podman's defaults may be past what its runtime, our child, may set); runc
    refuses more processes than the host has pids."""
    import resource

    try:
        pids = int(Path("/proc/sys/kernel/pid_max").read_text())
    except (OSError, ValueError):
        pids = 32768
    flags = []
    for name, limit, most in (
        ("nofile", resource.RLIMIT_NOFILE, 2**20),
        ("nproc", resource.RLIMIT_NPROC, pids),
    ):
        hard = resource.getrlimit(limit)[1]
        value = most if hard == resource.RLIM_INFINITY else min(hard, most)
        flags.append(f"--ulimit={name}={value}:{value}")
    return flags


def boot_frame() -> bytes:
    """The first frame the container reads: the worker's code. Its second is
    ``token_frame``."""
    return sources.boot_frame(HOST / "stream_worker.py")


def token_frame(token: str) -> bytes:
    """The second frame: this launch's token, which pid 1 reads once the worker is
    forked (so the worker's memory never holds it) and prefixes its exit line with."""
    return bridge.frame({"op": "token", "token": token})


def how_it_ended(said: bytes, token: str) -> str | None:
    """What pid 1's exit line in ``said`` (the container's stderr) says ("oom",
    "signal 9", "status 1"), if one carries ``token``; another line is not believed."""
    mark = f"{EXIT_MARK} {token} "
    lines = said.decode("utf-8", "replace").splitlines()
    how = next((line for line in reversed(lines) if line.startswith(mark)), None)
    return None if how is None else how[len(mark) :].strip()


def _in_background(command: list[str]) -> None:
    """Run a runtime command without waiting for it (a thread reaps it)."""
    quiet = subprocess.DEVNULL
    try:
        started = subprocess.Popen(
            command, stdin=quiet, stdout=quiet, stderr=quiet, env=client_environment()
        )
    except OSError:
        return
    threading.Thread(target=started.wait, name="rlm-container-kill", daemon=True).start()


class ContainerProcess(SandboxProcess):
    """A container running the process worker, its bridge over stdin and stdout."""

    # What result.isolation reports for this backend (stream_worker.container_report).
    LAYERS = ("container", "filesystem", "network", "environment", "user", "processes", "memory")
    REQUIRED_LAYERS = LAYERS[:-1]  # the memory limit is reported, as the process backend's

    def __init__(
        self,
        process: subprocess.Popen[bytes],
        loop: asyncio.AbstractEventLoop,
        found: Runtime,
        name: str,
        settings: SandboxSettings,
    ):
        self.process = process
        self.runtime = found
        self.name = name  # the container's: how the kernel kills and removes it
        self.settings = settings
        self.workdir = ""
        self.dead: str | None = None
        self.relays = False
        self.frame_size = 0
        self.killed = False  # by the kernel: ``kill`` asks the runtime once
        self.token = tokens.token_hex(16)  # pid 1's exit line carries it (how_it_ended)
        assert process.stdout is not None and process.stdin is not None
        self.reader = pipes.PipeReader(process.stdout, loop, "rlm-container-out")  # type: ignore[assignment]
        self.pipe = pipes.PipeWriter(process.stdin, "rlm-container-in")
        self.said = b""  # the end of the container's stderr
        self.said_all = threading.Event()
        threading.Thread(target=self._keep_stderr, name="rlm-container-err", daemon=True).start()

    def _keep_stderr(self) -> None:
        stderr = self.process.stderr
        assert stderr is not None
        try:
            while line := stderr.readline(_STDERR_KEPT):
                self.said = (self.said + line)[-_STDERR_KEPT:]
        except (OSError, ValueError):
            pass
        finally:
            stderr.close()  # here, at its end: no other thread reads it
            self.said_all.set()

    def init_fields(self, settings: SandboxSettings, isolate: bool) -> dict[str, Any]:
        """What the worker checks the container's layers against."""
        limits = {name: getattr(settings, name) for name in ("memory_mb", "max_processes")}
        return {"container": {"runtime": self.runtime.name, "disk_mb": settings.disk_mb, **limits}}

    async def handshake(
        self, init: bytes, pickled: bytes, carried: tuple[bytes, ...] | None = None
    ) -> Any:
        parts = [boot_frame(), token_frame(self.token), init]
        parts += [bridge.pickle_frame_header(len(pickled)), pickled]
        if carried is not None:  # one frame, written part by part: never joined
            parts += [bridge.pickle_frame_header(sum(map(len, carried)), bridge.DATA), *carried]
        for part in parts:
            self.pipe.write(part)
        try:
            return await asyncio.wait_for(self.await_ready(carried is not None), HANDSHAKE_S)
        except asyncio.TimeoutError:
            said = self.said.decode("utf-8", "replace").split("\n")
            last = next((line.strip()[:200] for line in reversed(said) if line.strip()), "")
            raise SandboxError(
                f"the container sandbox did not start within {HANDSHAKE_S:g}s"
                + (f": its stderr ends {last!r}" if last else " (nothing on its stderr)")
            ) from None
        except (asyncio.IncompleteReadError, ConnectionError) as exc:
            why = await self.exit_reason()
            raise SandboxError(f"the container sandbox did not start: {why} ({exc})") from None

    async def drained(self) -> None:
        await self.pipe.drained()

    def write(self, data: bytes) -> None:
        self.pipe.write(data)
        self.check_unread(self.pipe.waiting())

    # -- its end -----------------------------------------------------------------------
    def signal(self, signum: int) -> None:
        """SIGINT goes in band (the worker raises it on its main thread, namespace kept);
        any other signal kills the container."""
        if signum == signals.SIGINT:
            self.pipe.write(bridge.INTERRUPT)
        else:
            self.kill()

    def kill(self) -> None:
        """Kill the container (all its processes at once), without waiting: the bridge's
        end says when it is gone; ``end`` removes what is left."""
        if not self.killed and self.process.poll() is None:
            self.killed = True
            _in_background([self.runtime.binary, "kill", self.name])

    async def end(self) -> None:
        await asyncio.to_thread(self.end_now)

    def end_now(self) -> None:
        """End the container, wait for the runtime's client, remove the container
        whatever state it was left in (a client killed before it could), and close the
        kernel's ends of its pipes."""
        self.pipe.close()  # the worker ends at its bridge's end: faster than a kill
        try:
            self.process.wait(_GRACE_S)
        except subprocess.TimeoutExpired:
            self.kill()
            try:
                self.process.wait(5)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        remove = [self.runtime.binary, "rm", "-f", self.name]
        if self.runtime.name == "podman":
            remove[3:3] = ["--time=0"]
        try:
            _run(remove)
        except (OSError, subprocess.TimeoutExpired):
            pass
        self._close_pipes()
        if self.workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)

    def _close_pipes(self) -> None:
        """Its stdout, with the reader that reads it (stdin is closed by its writer;
        stderr by the thread that reads it, at its end, which the client's exit brings)."""
        cast(pipes.PipeReader, self.reader).close()
        self.said_all.wait(1)

    async def exit_reason(self) -> str:
        try:
            code = await asyncio.wait_for(asyncio.to_thread(self.process.wait), 2)
        except asyncio.TimeoutError:
            return "it closed the bridge"
        await asyncio.to_thread(self.said_all.wait, 1)
        how = how_it_ended(self.said, self.token)
        if how is None:
            said = self.said.decode("utf-8", "replace").strip().splitlines()
            reason = f"the sandbox's container ended (status {code})"
            return f"{reason}: {said[-1][:300]}" if said else reason
        if how == "oom":
            return (
                "the sandbox ran out of memory: its container's limit of "
                f"{self.settings.memory_mb} MB (RLM.sandbox_memory_mb) killed it"
            )
        kind, _, number = how.partition(" ")  # "signal 9", "status 1"
        if kind == "signal" and number.isdigit() and int(number) in set(signals.Signals):
            return f"the sandbox process died ({signals.Signals(int(number)).name})"
        return f"the sandbox process exited ({how[:40]})"


async def launch(secrets: tuple[str | None, ...], settings: SandboxSettings) -> ContainerProcess:
    """Start a sandbox container; it waits for the handshake. The container gets none
    of the kernel's environment, so no ``secrets`` can reach it."""
    found = await asyncio.to_thread(runtime)
    if isinstance(found, str):
        raise SandboxError(f"RLM.sandbox = 'container' cannot run here: {found}")
    name = f"rlm-sandbox-{os.getpid()}-{tokens.token_hex(6)}"
    folder = tempfile.mkdtemp(prefix="rlm-container-")
    process = _start(_command(found, name, settings, BOOT), folder)
    sandbox = ContainerProcess(process, asyncio.get_running_loop(), found, name, settings)
    sandbox.workdir = folder
    return sandbox


def _start(command: list[str], folder: str) -> subprocess.Popen[bytes]:
    """The runtime's client, on the loop: a fork and exec of a few milliseconds (the
    container starts while the kernel sends it the handshake). It runs in ``folder``, a
    folder of its own: podman's monitor writes files where it runs ("oom" after an
    out-of-memory kill), which must not land in the notebook's folder."""
    try:
        return subprocess.Popen(
            command,
            cwd=folder,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,  # the notebook's Ctrl-C is not the sandbox's
            env=client_environment(),
        )
    except OSError as exc:
        raise SandboxError(f"the container sandbox could not start: {exc}") from None
