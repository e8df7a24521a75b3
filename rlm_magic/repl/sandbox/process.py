"""A sandbox process's life, seen from the kernel: started (``spawn``) in a fresh
folder with an allow-listed environment, met through a handshake that maps its ids and
hands it the context, read one checked frame at a time, and killed with everything it
started, however it ends.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from ...errors import SandboxError
from .. import bridge, isolation
from ..base import SandboxSettings
from ..bridge import Message
from .environment import sandbox_environment

_WORKER = str(Path(__file__).parent.with_name("worker.py"))  # rlm_magic/repl/worker.py
_PIECE = 2**20  # a large frame is read and checked this many bytes at a time
# Replies the sandbox has not read yet, at most: past this it is not reading them (its
# bridge thread stopped), and the kernel stops it rather than buffer without end.
MAX_UNREAD = 32 * 2**20
# A session's carried variables load in a second or two (32 MB at most); past this, the
# earlier question's code made them to stall the next (a Decimal of 10**10**8 digits).
CARRIED_LOAD_S = 30.0


class CarriedRefused(SandboxError):
    """A session's variables carried from an earlier question could not be loaded
    safely: that question's code may have tampered with them."""

    def __init__(self, why: str):
        super().__init__(
            "the variables carried from this session's earlier questions could not be "
            f"loaded safely ({why}): code from an earlier question may have tampered "
            "with them. They are dropped; the session's next question starts without them"
        )


class SandboxProcess:
    """One worker process and its end of the bridge."""

    # What result.isolation reports for this backend (isolation.report).
    LAYERS: tuple[str, ...] = isolation.LAYERS
    REQUIRED_LAYERS: tuple[str, ...] = isolation.REQUIRED_LAYERS

    def __init__(self, process: subprocess.Popen[bytes], sock: socket.socket, workdir: str):
        self.process = process
        self.sock = sock
        self.reader: asyncio.StreamReader | None = None  # once the context is sent
        self.writer: asyncio.StreamWriter | None = None
        self.workdir = workdir
        self.dead: str | None = None  # why it is gone
        # In a PID namespace of its own, the process we started only relays signals to
        # the worker (pid 1 there); killing it kills the whole namespace.
        self.relays = False
        self.frame_size = 0  # of the message read last

    # -- its start ---------------------------------------------------------------------
    def init_fields(self, settings: SandboxSettings, isolate: bool) -> dict[str, Any]:
        """What the worker's 'init' says beside the helpers: the isolation policy it
        applies to itself (``isolate``: off only in tests and benchmarks)."""
        policy = isolation.policy_for(
            self.workdir,
            memory_mb=settings.memory_mb,
            max_processes=settings.max_processes,
            disk_mb=settings.disk_mb,
            host_maps_ids=os.geteuid() == 0,
        )
        return {"policy": vars(policy), "isolate": isolate}

    async def handshake(
        self, init: bytes, pickled: bytes, carried: tuple[bytes, ...] | None = None
    ) -> Any:
        """Send ``init``, the context and any ``carried`` variables, and wait for the
        worker to be ready; returns the isolation report it sends (unchecked)."""
        # A blocking exchange in a thread: it maps the sandbox's ids between two
        # messages, and moves a large context several times faster than the event
        # loop's transport, which sends a socket buffer per turn.
        self.sock.settimeout(60)
        await asyncio.to_thread(_handshake, self.sock, self.process.pid, init, pickled, carried)
        self.reader, self.writer = await asyncio.open_unix_connection(sock=self.sock)
        return await self.await_ready(carried is not None)

    async def await_ready(self, carried: bool) -> Any:
        """The worker's 'ready' (after 'unpacking' when variables are ``carried``), and
        the isolation report it holds (unchecked)."""
        ready = await self.read()
        if carried and ready.get("op") == "unpacking":
            try:
                ready = await asyncio.wait_for(self.read(), CARRIED_LOAD_S)
            except asyncio.TimeoutError:
                raise CarriedRefused(f"they did not load within {CARRIED_LOAD_S:g}s") from None
            refused = ready.get("carried_refused")
            if refused is not None:
                raise CarriedRefused(str(refused)[:300])
        if ready.get("op") == "fatal":
            raise SandboxError(str(ready.get("error"))[:500])
        if ready.get("op") != "ready":
            raise bridge.BridgeError(f"expected 'ready', got {ready.get('op')!r}")
        return ready.get("isolation")

    # -- the wire ----------------------------------------------------------------------
    async def read(self) -> Message:
        """One message, checked for size and values before it is decoded (bridge.py)."""
        reader = self.reader
        assert reader is not None  # connected by the handshake
        header = await reader.readexactly(bridge.HEADER.size)
        _, length = bridge.parse_header(header)
        self.frame_size = length
        if length <= _PIECE:
            body = await reader.readexactly(length)
            bridge.check_body(body)
            return bridge.parse_json(body)
        check, pieces = bridge.BodyCheck(), []
        while length:
            piece = await reader.readexactly(min(_PIECE, length))
            check.add(piece)
            pieces.append(piece.decode("ascii"))
            length -= len(piece)
            await asyncio.sleep(0)  # the loop's other work between pieces
        return bridge.parse_json("".join(pieces))

    def write(self, data: bytes) -> None:
        writer = self.writer
        assert writer is not None  # connected by the handshake
        writer.write(data)
        if self.check_unread(writer.transport.get_write_buffer_size()):
            writer.transport.abort()  # the buffered replies go now, not at its end

    def check_unread(self, waiting: int) -> bool:
        """Stop a sandbox that leaves ``waiting`` bytes of replies unread past the limit."""
        if waiting <= MAX_UNREAD:
            return False
        self.kill_because(
            f"it did not read the kernel's replies ({waiting / 2**20:.0f} MB waited for it, "
            f"at most {MAX_UNREAD // 2**20} MB may)"
        )
        return True

    async def drained(self) -> None:
        """Until what was written has (mostly) left for the sandbox."""
        assert self.writer is not None  # connected by the handshake
        try:
            await self.writer.drain()
        except ConnectionError:
            pass  # it died: the listener says so

    def send(self, message: Message) -> None:
        if not self.dead:
            self.write(bridge.frame(message))

    # -- its end -----------------------------------------------------------------------
    def signal(self, signum: int) -> None:
        """Signal the worker and every process it started: through the relay in a PID
        namespace (model code may have left the process group), else its process
        group, which outlives the worker if they do."""
        try:
            if self.relays and signum in (signal.SIGINT, signal.SIGTERM):
                os.kill(self.process.pid, signum)
            else:
                os.killpg(self.process.pid, signum)
        except (ProcessLookupError, PermissionError):
            pass

    def kill(self) -> None:
        """Kill the worker and everything it started. Through the relay, which kills the
        PID namespace's pid 1 (the kernel then kills the rest) and reaps it, so no
        orphan is left to a parent that may not reap (a kernel running as pid 1)."""
        self.signal(signal.SIGTERM if self.relays else signal.SIGKILL)

    def kill_because(self, why: str) -> None:
        self.dead = self.dead or why
        self.kill()

    async def end(self) -> None:
        """Kill the process (if alive), reap it and remove its folder."""
        self.kill()
        if self.writer is not None:
            self.writer.close()
        else:
            self.sock.close()
        try:
            await asyncio.wait_for(asyncio.to_thread(self.process.wait), 5)
        except asyncio.TimeoutError:
            pass
        finally:
            self.signal(signal.SIGKILL)  # whatever is left of its process group
            shutil.rmtree(self.workdir, ignore_errors=True)

    def end_now(self) -> None:
        """``end`` without a loop to wait on: the process is killed and reaped, its
        socket closed and its folder removed."""
        self.kill()
        try:
            (self.writer.transport if self.writer else self.sock).close()
        except RuntimeError:  # its loop is closed: the socket goes with the process
            pass
        try:
            self.process.wait(5)
        except subprocess.TimeoutExpired:
            pass
        shutil.rmtree(self.workdir, ignore_errors=True)

    async def exit_reason(self) -> str:
        try:
            code = await asyncio.wait_for(asyncio.to_thread(self.process.wait), 2)
        except asyncio.TimeoutError:
            return "it closed the bridge"
        if code < 0:
            try:
                name = signal.Signals(-code).name
            except ValueError:
                name = f"signal {-code}"
            return f"the sandbox process died ({name})"
        return f"the sandbox process exited (status {code})"


async def launch(secrets: tuple[str | None, ...], settings: SandboxSettings) -> SandboxProcess:
    """The process backend's launcher (``backends``): ``spawn`` with the settings'
    environment names."""
    return spawn(secrets, settings.env_names)


def spawn(secrets: tuple[str | None, ...], env_names: tuple[str, ...]) -> SandboxProcess:
    """Start a worker process in a fresh temporary folder, with its end of the bridge;
    it waits for ``SandboxProcess.handshake``."""
    if not os.access(_WORKER, os.R_OK):
        raise SandboxError(
            f"the sandbox cannot read its own code ({_WORKER}): make "
            "the rlm_magic package readable, or run with --no-sandbox"
        )
    workdir = tempfile.mkdtemp(prefix="rlm-sandbox-")
    parent, child = socket.socketpair()
    try:
        # Popen on the loop: a fork and exec of a few milliseconds, measured cheaper
        # than asyncio's subprocess machinery, and the process is waited for in a thread.
        process = subprocess.Popen(
            [sys.executable, "-I", _WORKER, str(child.fileno())],
            pass_fds=[child.fileno()],
            cwd=workdir,
            env=sandbox_environment(secrets, workdir, env_names),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
    except OSError as exc:
        parent.close()
        shutil.rmtree(workdir, ignore_errors=True)
        raise SandboxError(f"the sandbox process could not start: {exc}") from None
    finally:
        child.close()
    return SandboxProcess(process, parent, workdir)


def _handshake(
    sock: socket.socket, pid: int, init: bytes, pickled: bytes, carried: tuple[bytes, ...] | None
) -> None:
    """The start of a sandbox's life, blocking (run in a thread): send ``init``; the
    worker enters its namespaces and says whether it needs its ids mapped (it runs as
    root: we make its root the unprivileged ``SANDBOX_UID``); then send the context,
    and a session's carried variables."""
    sock.sendall(init)
    kind, length = bridge.parse_header(bridge.read_exactly(sock, bridge.HEADER.size))
    body = bytes(bridge.read_exactly(sock, length))
    bridge.check_body(body)
    message = bridge.parse_json(body)
    if message.get("op") == "fatal":
        raise SandboxError(str(message.get("error"))[:500])
    if message.get("op") != "unshared":
        raise bridge.BridgeError(f"expected 'unshared', got {message.get('op')!r}")
    mapped = message.get("map_ids") is True and _map_ids(pid)
    sock.sendall(
        bridge.frame({"op": "ids", "mapped": mapped}) + bridge.pickle_frame_header(len(pickled))
    )
    sock.sendall(pickled)
    if carried is not None:  # one frame, sent part by part: no copy of it is made
        sock.sendall(bridge.pickle_frame_header(sum(map(len, carried)), bridge.DATA))
        for part in carried:
            sock.sendall(part)


def _map_ids(pid: int) -> bool:
    """Map the sandbox's root (uid and gid 0 in its user namespace) to an unprivileged
    id outside. Only a privileged kernel may; the worker maps itself otherwise."""
    try:
        for name, outside in (
            ("uid_map", isolation.SANDBOX_UID),
            ("gid_map", isolation.SANDBOX_GID),
        ):
            with open(f"/proc/{pid}/{name}", "w") as file:
                file.write(f"0 {outside} 1")
        return True
    except OSError:
        return False
