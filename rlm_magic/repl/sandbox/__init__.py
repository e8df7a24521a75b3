"""The sandboxed REPL: model code runs in a process of its own (``worker.py``), and the
helpers it calls are served here, on the kernel's loop, over the bridge.

``SandboxREPL`` has the in-process REPL's interface, so the engine runs either. What it
adds is the trust boundary: everything the sandbox sends is framed JSON under a size
limit, checked before use; a sandbox that breaks the protocol, crashes or will not stop
is killed, the step reports it, and the next step runs in a fresh sandbox whose
namespace holds only ``context`` and the helpers again.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import pickle
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .. import bridge, isolation
from ..base import REPL, Helpers, SandboxSettings
from ..helpers import BATCH_NAMES
from ..steps import StepOutput

_step_ids = itertools.count(1)
_WORKER = str(Path(__file__).parent.with_name("worker.py"))  # rlm_magic/repl/worker.py
_warned_isolation = False
_PIECE = 2**20  # a large frame is read and checked this many bytes at a time
_HELD_LIMIT = 64 * 2**20  # helper calls' messages the kernel holds at once, at most
# What to do where the OS refuses layers.
if sys.platform.startswith("linux"):
    _REMEDY = (
        "allow unprivileged user namespaces (sysctl "
        "kernel.unprivileged_userns_clone=1; on Ubuntu 24.04 "
        "kernel.apparmor_restrict_unprivileged_userns=0, or an AppArmor profile for "
        "python); in Docker, run with --security-opt seccomp=unconfined or give the "
        "kernel its own VM"
    )
else:
    _REMEDY = "run the kernel on Linux (a VM or a container) for them"


class SandboxError(RuntimeError):
    """The sandbox process could not be started or used."""


class SandboxRepr(str):
    """A value that stayed in the sandbox: its ``repr`` there, shown as written."""

    def __new__(cls, text: str, type_name: str = ""):
        value = super().__new__(cls, text)
        value.type_name = type_name
        return value

    def __repr__(self) -> str:
        return str(self)


# The only variables of the kernel's environment the sandbox gets (an allow-list: a
# deny-list of secret-looking names lets DATABASE_URL or SENTRY_DSN through), plus
# those named in RLM.sandbox_env. None whose value holds a configured secret.
ENVIRONMENT_ALLOWED = (
    "LANG",
    "LANGUAGE",
    "LC_ALL",
    "LC_CTYPE",
    "LC_COLLATE",
    "LC_MESSAGES",
    "LC_NUMERIC",
    "LC_TIME",
    "LC_MONETARY",
    "TZ",
    "TERM",
)
_SAFE_PATH = "/usr/local/bin:/usr/bin:/bin"


def sandbox_environment(
    secrets: tuple[str | None, ...] = (), workdir: str = "", names: tuple[str, ...] = ()
) -> dict[str, str]:
    """The sandbox's whole environment: the allowed variables of the kernel's, and a
    PATH, HOME and TMPDIR of its own."""
    secrets = tuple(s for s in secrets if s)
    env = {
        name: os.environ[name]
        for name in (*ENVIRONMENT_ALLOWED, *names)
        if name in os.environ and not any(s in os.environ[name] for s in secrets)
    }
    env.update(PATH=_SAFE_PATH, HOME=workdir, TMPDIR=workdir)
    return env


class _Sandbox:
    """One worker process and its end of the bridge."""

    def __init__(self, process: subprocess.Popen, sock: socket.socket, workdir: str):
        self.process = process
        self.sock = sock
        self.reader: asyncio.StreamReader | None = None  # once the context is sent
        self.writer: asyncio.StreamWriter | None = None
        self.workdir = workdir
        self.dead: str | None = None  # why it is gone
        # In a PID namespace of its own, the process we started only relays signals to
        # the worker (pid 1 there); killing it kills the whole namespace.
        self.relays = False

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


class SandboxREPL:
    """A REPL whose namespace lives in a sandbox process for the whole run.

    ``helpers`` maps names to coroutine functions served on this loop (the kernel's).
    """

    # SIGINT stops a step and keeps the namespace; a step that does not stop this soon
    # after is killed with its process.
    STOP_GRACE_S = 0.5
    # Off only in tests and benchmarks: a machine where the OS refuses every layer.
    isolate = True

    def __init__(
        self,
        context: Any,
        helpers: Helpers,
        *,
        max_output_chars: int = 20_000,
        secrets: tuple[str | None, ...] = (),
        context_names: tuple[str, ...] = (),
        settings: SandboxSettings | None = None,
        sub_calls_left: Callable[[], int] | None = None,
    ):
        self.context = context
        # Names the context also goes by (a session's context_0): one copy, many names.
        self.context_names = ("context", *context_names)
        self.helpers = helpers
        self.max_output_chars = max_output_chars
        self.secrets = secrets
        self.settings = settings or SandboxSettings()
        # A batch larger than the run's sub-calls left is refused before it is expanded.
        self.sub_calls_left = sub_calls_left
        self.loop = asyncio.get_running_loop()
        self.last_output: StepOutput | None = None
        self.network_isolated: bool | None = None
        self.isolation: dict | None = None  # the layers in force (result.isolation)
        self._sandbox: _Sandbox | None = None
        self._starting: asyncio.Task | None = None
        self._listener: asyncio.Task | None = None
        self._pickled: bytes | None = None
        self._reply: asyncio.Future | None = None  # the one request awaiting an answer
        self._reply_op = ""
        self._step: int | None = None  # the step whose helper calls are served
        self._calls: set[asyncio.Task] = set()
        self._call_tasks: dict[int, asyncio.Task] = {}  # by the sandbox's call id
        self._overdue: list[str] = []  # replies to requests that timed out
        self._closed = False
        self._frame_size = 0  # of the message being handled
        self._held = 0  # bytes of the helper calls being served

    # -- life cycle ----------------------------------------------------------------------
    async def start(self) -> None:
        """Pickle the context (a context that cannot cross fails the run here, before
        any model is paid) and begin starting the sandbox; its first use waits for it."""
        try:
            # Off the loop: a large context takes a while to pickle.
            self._pickled = await asyncio.to_thread(
                pickle.dumps, self.context, pickle.HIGHEST_PROTOCOL
            )
        except Exception as exc:  # noqa: BLE001 - any pickling failure, one line
            raise SandboxError(
                f"the context ({type(self.context).__name__}) cannot be sent to the "
                f"sandbox: {type(exc).__name__}: {exc}; run with --no-sandbox "
                "(RLM.sandbox = 'none')"
            ) from None
        self._starting = self.loop.create_task(self._start())

    async def _ready(self) -> _Sandbox:
        if self._closed:
            raise RuntimeError("this REPL is closed")
        if self._starting is None:
            raise RuntimeError("SandboxREPL.start() was not awaited")
        if self._starting.done() and self._sandbox is not None and self._sandbox.dead:
            self._starting = self.loop.create_task(self._start())
        return await asyncio.shield(self._starting)

    async def _start(self) -> _Sandbox:
        old = self._sandbox
        if old is not None:
            if self._listener is not None:
                self._listener.cancel()
            await old.end()
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
            process = subprocess.Popen(  # noqa: ASYNC220
                [sys.executable, "-I", _WORKER, str(child.fileno())],
                pass_fds=[child.fileno()],
                cwd=workdir,
                env=sandbox_environment(self.secrets, workdir, self.settings.env_names),
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
        sandbox = self._sandbox = _Sandbox(process, parent, workdir)
        policy = isolation.policy_for(
            workdir,
            memory_mb=self.settings.memory_mb,
            max_processes=self.settings.max_processes,
            disk_mb=self.settings.disk_mb,
            host_maps_ids=os.geteuid() == 0,
        )
        init = bridge.frame(
            {
                "op": "init",
                "helpers": sorted(self.helpers),
                "context_names": list(self.context_names),
                "policy": vars(policy),
                "isolate": self.isolate,
            }
        )
        try:
            # A blocking exchange in a thread: it maps the sandbox's ids between two
            # messages, and moves a large context several times faster than the event
            # loop's transport, which sends a socket buffer per turn.
            parent.settimeout(60)
            await asyncio.to_thread(_handshake, parent, process.pid, init, self._pickled)
            sandbox.reader, sandbox.writer = await asyncio.open_unix_connection(sock=parent)
            ready = await self._read(sandbox)
            if ready.get("op") == "fatal":
                raise SandboxError(str(ready.get("error"))[:500])
            if ready.get("op") != "ready":
                raise bridge.BridgeError(f"expected 'ready', got {ready.get('op')!r}")
            self._take_isolation(sandbox, ready.get("isolation"))
        except BaseException as exc:  # cancelled too: no process or folder is left behind
            sandbox.dead = "failed to start"
            await sandbox.end()
            if isinstance(
                exc, (bridge.BridgeError, EOFError, OSError, asyncio.IncompleteReadError)
            ):
                raise SandboxError(f"the sandbox process did not start: {exc}") from None
            raise
        self._listener = self.loop.create_task(self._listen(sandbox))
        return sandbox

    def _take_isolation(self, sandbox: _Sandbox, report: Any) -> None:
        """Read the worker's isolation report: ``result.isolation``, a warning once for
        a layer the OS refused, and a refusal to go on if full isolation is required.
        (The worker reports before any model code runs, so the report is its own.)"""
        layers = report.get("layers") if isinstance(report, dict) else None
        notes = report.get("notes") if isinstance(report, dict) else None
        if not isinstance(layers, dict) or not isinstance(notes, dict):
            raise bridge.BridgeError("a 'ready' message without an isolation report")
        layers = {name: layers.get(name) is True for name in isolation.LAYERS}
        notes = {str(k): str(v)[:300] for k, v in notes.items() if k in isolation.LAYERS}
        self.isolation = {**layers, "notes": notes}
        self.network_isolated = layers["network"]
        sandbox.relays = layers["pid"]
        missing = [name for name in isolation.REQUIRED_LAYERS if not layers[name]]
        if not missing:
            return
        why = "; ".join(f"{name}: {notes.get(name, 'refused')}" for name in missing)
        if self.settings.require_isolation:
            raise SandboxError(
                f"the sandbox is not fully isolated here ({why}); "
                f"RLM.sandbox_require_isolation is set, so the run does not "
                f"start. Remedy: {_REMEDY}"
            )
        _warn_isolation_once(
            f"the RLM sandbox runs without {', '.join(missing)} "
            f"isolation here ({why}); result.isolation says so. To fix: "
            f"{_REMEDY}"
        )

    async def aclose(self) -> None:
        """End the sandbox, however the run ended; no helper call is served again."""
        self._closed = True
        self._step = None
        for task in list(self._calls):
            task.cancel()
        starting, self._starting = self._starting, None
        if starting is not None:
            # Cancelled if still starting; a start that failed is read here, so asyncio
            # does not log "Task exception was never retrieved" for a run that ran no code.
            starting.cancel()
            await asyncio.gather(starting, return_exceptions=True)
        if self._listener is not None:
            self._listener.cancel()
        if self._sandbox is not None:
            self._sandbox.dead = self._sandbox.dead or "closed"
            await self._sandbox.end()

    def close(self) -> None:
        """End the sandbox without a loop to wait on: its process is killed and reaped,
        its socket closed and its folder removed, as ``aclose`` does."""
        self._closed = True
        sandbox = self._sandbox
        if sandbox is not None:
            self._kill(sandbox, "closed")
            try:
                (sandbox.writer.transport if sandbox.writer else sandbox.sock).close()
            except RuntimeError:  # its loop is closed: the socket goes with the process
                pass
            try:
                sandbox.process.wait(5)
            except subprocess.TimeoutExpired:
                pass
            shutil.rmtree(sandbox.workdir, ignore_errors=True)

    # -- the wire -----------------------------------------------------------------------------
    async def _read(self, sandbox: _Sandbox) -> dict:
        """One message, checked for size and values before it is decoded (bridge.py)."""
        header = await sandbox.reader.readexactly(bridge.HEADER.size)
        _, length = bridge.parse_header(header)
        self._frame_size = length
        if length <= _PIECE:
            body = await sandbox.reader.readexactly(length)
            bridge.check_body(body)
            return bridge.parse_json(body)
        check, pieces = bridge.BodyCheck(), []
        while length:
            piece = await sandbox.reader.readexactly(min(_PIECE, length))
            check.add(piece)
            pieces.append(piece.decode("ascii"))
            length -= len(piece)
            await asyncio.sleep(0)  # the loop's other work between pieces
        return bridge.parse_json("".join(pieces))

    def _send(self, sandbox: _Sandbox, message: dict) -> None:
        if not sandbox.dead:
            sandbox.writer.write(bridge.frame(message))

    async def _listen(self, sandbox: _Sandbox) -> None:
        """Read everything the sandbox sends, until it dies or breaks the protocol."""
        try:
            while not sandbox.dead:
                message = await self._read(sandbox)
                if message["op"] == "call":
                    self._serve_call(sandbox, message)
                elif message["op"] == "cancel":
                    task = self._call_tasks.get(message.get("id"))
                    if task is not None:
                        task.cancel()
                elif self._reply is not None and message["op"] == self._reply_op:
                    if not self._reply.done():
                        self._reply.set_result(message)
                elif message["op"] in self._overdue:
                    self._overdue.remove(message["op"])  # an answer we stopped waiting for
                else:
                    raise bridge.BridgeError(f"an unexpected {message['op']!r} message")
        except asyncio.CancelledError:
            raise
        except (asyncio.IncompleteReadError, ConnectionError, OSError):
            sandbox.dead = sandbox.dead or await self._exit_reason(sandbox)
        except bridge.BridgeError as exc:
            sandbox.dead = sandbox.dead or f"it broke the bridge protocol: {exc}"
        except Exception as exc:  # noqa: BLE001 - anything odd from the sandbox ends it
            sandbox.dead = sandbox.dead or (
                f"it broke the bridge protocol: {type(exc).__name__}: {exc}"
            )
        sandbox.kill()
        if self._reply is not None and not self._reply.done():
            self._reply.set_exception(SandboxError(sandbox.dead))

    async def _exit_reason(self, sandbox: _Sandbox) -> str:
        try:
            code = await asyncio.wait_for(asyncio.to_thread(sandbox.process.wait), 2)
        except asyncio.TimeoutError:
            return "it closed the bridge"
        if code < 0:
            try:
                name = signal.Signals(-code).name
            except ValueError:
                name = f"signal {-code}"
            return f"the sandbox process died ({name})"
        return f"the sandbox process exited (status {code})"

    async def _request(self, op: str, reply_op: str, timeout: float, **fields) -> dict:
        sandbox = await self._ready()
        if sandbox.dead:
            raise SandboxError(sandbox.dead)
        reply = self._expect(reply_op)
        try:
            self._send(sandbox, {"op": op, **fields})
            return await self._await_reply(reply, reply_op, timeout)
        finally:
            self._reply = None

    # -- serving helper calls -----------------------------------------------------------------
    def _serve_call(self, sandbox: _Sandbox, message: dict) -> None:
        call_id, name = message.get("id"), message.get("name")
        args, kwargs = message.get("args"), message.get("kwargs")
        if not (
            isinstance(call_id, int)
            and name in self.helpers
            and isinstance(args, list)
            and isinstance(kwargs, dict)
        ):
            raise bridge.BridgeError("a malformed helper call")
        if self._closed or self._step is None or message.get("step") != self._step:
            # A stopped step (or a thread outliving it) sends nothing more to a model.
            self._send(sandbox, {"op": "result", "id": call_id, "stopped": True})
            return
        args, kwargs, refused = self._within_budget(name, args, kwargs)
        size = self._frame_size
        if self._held + size > _HELD_LIMIT:
            # Calls wait for a free slot with their prompts in the kernel's memory: so
            # many that they would hold more than this are refused, not queued.
            self._send(
                sandbox,
                {
                    "op": "result",
                    "id": call_id,
                    "error": (
                        f"RuntimeError: the kernel already holds {self._held / 2**20:.0f} MB of "
                        f"prompts waiting to be sent (at most {_HELD_LIMIT // 2**20} MB): wait "
                        "for answers before sending more"
                    ),
                },
            )
            return
        try:
            coroutine = self.helpers[name](*args, **kwargs)
        except TypeError as exc:  # wrong arguments: raised in the model's code, as in-process
            self._send(
                sandbox, {"op": "result", "id": call_id, "error": str(exc), "type": "TypeError"}
            )
            return
        task = self.loop.create_task(coroutine)
        self._calls.add(task)
        self._call_tasks[call_id] = task
        self._held += size

        def answer(task: asyncio.Task) -> None:
            self._calls.discard(task)
            self._call_tasks.pop(call_id, None)
            self._held -= size
            if task.cancelled():
                self._send(sandbox, {"op": "result", "id": call_id, "stopped": True})
            elif task.exception() is not None:
                error = task.exception()
                self._send(
                    sandbox,
                    {"op": "result", "id": call_id, "error": f"{type(error).__name__}: {error}"},
                )
            else:
                self._send(
                    sandbox,
                    {
                        "op": "result",
                        "id": call_id,
                        "value": task.result(),
                        **({"refused": refused} if refused else {}),
                    },
                )

        task.add_done_callback(answer)

    def _within_budget(self, name: str, args: list, kwargs: dict):
        """A batch with more prompts than the run has sub-calls left goes to the helper
        cut to what is left; the rest are refused here, before the kernel expands them
        (into tasks, or error strings sent back one by one). The worker appends one
        error string per refused prompt, so the model sees what in-process code sees."""
        if name not in BATCH_NAMES or self.sub_calls_left is None:
            return args, kwargs, None
        key = "prompts" if not args else None
        prompts = kwargs.get("prompts") if key else args[0]
        if not isinstance(prompts, list):
            return args, kwargs, None
        left = max(self.sub_calls_left(), 0)
        if len(prompts) <= left:
            return args, kwargs, None
        args, kwargs = list(args), dict(kwargs)
        if key:
            kwargs["prompts"] = prompts[:left]
        else:
            args[0] = prompts[:left]
        for where, index in ((args, 1), (kwargs, "contexts")):  # rlm_query_batch's
            if isinstance(where, list) and len(where) > 1 and isinstance(where[1], list):
                where[1] = where[1][:left]
            elif isinstance(where, dict) and isinstance(where.get(index), list):
                where[index] = where[index][:left]
        limit = self.settings.max_sub_calls
        return (
            args,
            kwargs,
            {
                "count": len(prompts) - left,
                "error": (
                    f"Error: max_sub_calls={limit} reached for this run; no request was sent"
                ),
            },
        )

    # -- running steps ------------------------------------------------------------------------
    async def run(self, code: str, timeout: float | None = None) -> StepOutput:
        """Run one block in the sandbox; never raises for errors in the code itself or a
        crash of the sandbox. If cancelled, it stops the step and re-raises;
        ``last_output`` then holds what is known of the step."""
        output = self.last_output = StepOutput(code=code)
        step = next(_step_ids)
        sandbox = await self._ready()  # start-up belongs to the run, not to this step
        started = time.perf_counter()
        reply = self._expect("done")
        self._step = step
        try:
            self._send(
                sandbox, {"op": "run", "step": step, "code": code, "limit": self.max_output_chars}
            )
            self._take(output, await asyncio.wait_for(asyncio.shield(reply), timeout))
        except asyncio.TimeoutError:
            await self._stop(sandbox, reply, output)
            output.timed_out = True
            output.error = (
                f"TimeoutError: this step ran longer than {timeout:g}s and was "
                "stopped" + self._lost_note(sandbox)
            )
        except asyncio.CancelledError:
            try:
                await self._stop(sandbox, reply, output)
            finally:
                output.error = "KeyboardInterrupt: the run was interrupted"
            raise
        except (SandboxError, bridge.BridgeError) as exc:
            self._kill(sandbox, str(exc))
            output.error = f"SandboxError: {sandbox.dead}" + self._lost_note(sandbox)
        finally:
            self._step = None
            self._reply = None
            output.elapsed_s = time.perf_counter() - started
        return output

    def _expect(self, op: str) -> asyncio.Future:
        """The future the listener resolves with the sandbox's next ``op`` message."""
        reply = self._reply = self.loop.create_future()
        self._reply_op = op
        reply.add_done_callback(lambda f: f.cancelled() or f.exception())  # retrieved
        return reply

    def _kill(self, sandbox: _Sandbox, why: str) -> None:
        sandbox.dead = sandbox.dead or why
        sandbox.kill()

    def _take(self, output: StepOutput, reply: dict) -> None:
        for key in ("stdout", "value", "error"):
            value = reply.get(key)
            if value is not None and not isinstance(value, str):
                raise bridge.BridgeError(f"a step result whose {key} is not text")
        output.stdout = reply.get("stdout") or ""
        output.value, output.error = reply.get("value"), reply.get("error")
        dropped = reply.get("dropped")
        output.dropped_chars = dropped if isinstance(dropped, int) and dropped > 0 else 0
        finish, restored = reply.get("finish"), reply.get("restored")
        if finish is not None and not (
            isinstance(finish, list)
            and len(finish) == 2
            and all(isinstance(x, str) for x in finish)
        ):
            raise bridge.BridgeError("a step result whose finish is not [how, answer]")
        output.finish = finish
        output.restored = (
            [name for name in restored if isinstance(name, str)][:50]
            if isinstance(restored, list)
            else []
        )

    async def _stop(self, sandbox: _Sandbox, reply: asyncio.Future, output: StepOutput) -> None:
        """SIGINT first, which keeps the namespace; SIGKILL if the step is still running
        after the grace period. Helper calls in flight are cancelled either way."""
        self._step = None
        for task in list(self._calls):
            task.cancel()
        sandbox.signal(signal.SIGINT)
        stopped = False
        try:
            self._take(output, await asyncio.wait_for(asyncio.shield(reply), self.STOP_GRACE_S))
            stopped = True
        except (asyncio.TimeoutError, SandboxError, bridge.BridgeError):
            pass
        finally:
            if not stopped:  # also when cancelled again meanwhile: no step left running
                self._kill(sandbox, "the step did not stop, so its process was killed")

    def _lost_note(self, sandbox: _Sandbox | None) -> str:
        if sandbox is None or not sandbox.dead:
            return ""
        return (
            "\nThe sandbox was restarted for your next step: every variable you made "
            "is lost; `context` and the helpers are there again."
        )

    # -- what the engine reads -----------------------------------------------------------
    async def final_var(self, name: str) -> str | None:
        value = (await self._request("final_var", "final_var", timeout=30, name=name)).get("value")
        return value if isinstance(value, str) else None

    def rebind(self, helpers: Helpers) -> None:
        """Serve the helpers of the next run (a session's REPL outlives its runs)."""
        self.helpers = helpers

    async def set_context(self, value: Any, names: list[str]) -> None:
        """Send a new context (pickled, kernel to sandbox only) under ``names``; a
        restarted sandbox gets it as ``context``."""
        try:
            pickled = await asyncio.to_thread(pickle.dumps, value, pickle.HIGHEST_PROTOCOL)
        except Exception as exc:  # noqa: BLE001 - any pickling failure, one line
            raise SandboxError(
                f"the context ({type(value).__name__}) cannot be sent to the "
                f"sandbox: {type(exc).__name__}: {exc}"
            ) from None
        sandbox = await self._ready()
        if sandbox.dead:
            raise SandboxError(sandbox.dead)
        reply = self._expect("context")
        try:
            sandbox.writer.write(
                bridge.frame({"op": "context", "names": names})
                + bridge.pickle_frame_header(len(pickled))
                + pickled
            )
            answer = await self._await_reply(reply, "context", 60)
        finally:
            self._reply = None
        if answer.get("error"):
            raise SandboxError(str(answer["error"])[:500])
        self._pickled = pickled
        self.context_names = ("context",)  # a restarted sandbox gets the latest as context

    async def set_variable(self, name: str, value: Any) -> None:
        """Put JSON data into the sandbox's namespace (only ever sent to it, as JSON).
        Framed in a thread: a long conversation (``history``) is megabytes of JSON."""
        framed = await asyncio.to_thread(bridge.frame, {"op": "set", "name": name, "value": value})
        sandbox = await self._ready()
        if sandbox.dead:
            raise SandboxError(sandbox.dead)
        reply = self._expect("set")
        try:
            sandbox.writer.write(framed)
            await self._await_reply(reply, "set", 30)
        finally:
            self._reply = None

    async def _await_reply(self, reply: asyncio.Future, op: str, timeout: float) -> dict:
        try:
            return await asyncio.wait_for(asyncio.shield(reply), timeout)
        except asyncio.TimeoutError:
            self._overdue.append(op)  # if it still comes, it is no protocol breach
            raise SandboxError(f"the sandbox did not answer {op!r} within {timeout:g}s") from None

    async def variable_names(self) -> list[str]:
        names = (await self._request("names", "names", timeout=30)).get("names")
        return [n for n in names if isinstance(n, str)] if isinstance(names, list) else []

    async def variables(self) -> dict[str, Any]:
        """The model's variables as JSON data, or ``SandboxRepr`` strings for the rest.
        Empty if the sandbox is gone or does not answer in time."""
        sandbox = self._sandbox
        if sandbox is None or sandbox.dead or self._closed:
            return {}
        try:
            data = (await self._request("variables", "variables", timeout=5)).get("variables")
        except (SandboxError, asyncio.TimeoutError, bridge.BridgeError):
            return {}
        out = {}
        for name, entry in (data or {}).items() if isinstance(data, dict) else ():
            if not isinstance(name, str) or not isinstance(entry, dict):
                continue
            if "json" in entry:
                out[name] = entry["json"]
            elif isinstance(entry.get("repr"), str):
                out[name] = SandboxRepr(entry["repr"], str(entry.get("type", "")))
        return out


def _handshake(sock: socket.socket, pid: int, init: bytes, pickled: bytes) -> None:
    """The start of a sandbox's life, blocking (run in a thread): send ``init``; the
    worker enters its namespaces and says whether it needs its ids mapped (it runs as
    root: we make its root the unprivileged ``SANDBOX_UID``); then send the context."""
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


def _warn_isolation_once(message: str) -> None:
    global _warned_isolation
    if not _warned_isolation:
        _warned_isolation = True
        warnings.warn(message, RuntimeWarning, stacklevel=3)


if TYPE_CHECKING:
    _: type[REPL] = SandboxREPL  # mypy checks that it has the engine's REPL interface
