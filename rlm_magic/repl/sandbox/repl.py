"""The sandboxed REPL: model code runs in a process of its own (``worker.py``), and the
helpers it calls are served here, on the kernel's loop, over the bridge.

``SandboxREPL`` has the in-process REPL's interface (``base.REPL``), so a run uses
either. What it adds is the trust boundary: everything the sandbox sends is framed JSON
under a size limit, checked before use; a sandbox that breaks the protocol, crashes or
will not stop is killed, the step reports it, and the next step runs in a fresh sandbox
whose namespace holds only ``context`` and the helpers again. The process's own life is
in ``process``; the helper calls it makes are served by ``calls``.

Why one module: what is left here is the REPL interface's requests and the listener
that pairs the sandbox's answers with them; each request's timeout, stop and kill
decide what the listener may still accept, so they are read and changed together.
"""

from __future__ import annotations

import asyncio
import base64
import itertools
import pickle
import re
import signal
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any

from ..._terminal_text import visible
from ...errors import SandboxError
from .. import bridge, carried
from ..base import Helpers, IsolatedREPL, SandboxSettings, SubCallBudget
from ..bridge import Message
from ..carried import Carried, SessionStart
from ..finishers import BLOCK_FINISHES
from ..provenance import Replayed
from ..steps import StepOutput
from .calls import HelperCalls
from .isolation_report import insist_on_isolation, read_isolation
from .process import CarriedRefused, SandboxProcess, launch

_step_ids = itertools.count(1)
# A backend's way to start a sandbox process (``repl.backends``): the secrets its
# environment must not hold, and the settings it runs with.
Launcher = Callable[[tuple[str | None, ...], SandboxSettings], Awaitable[SandboxProcess]]


class SandboxRepr(str):
    """A value that stayed in the sandbox: its ``repr`` there, shown as written, with its
    control characters visible (model code writes that repr)."""

    type_name: str

    def __new__(cls, text: str, type_name: str = "") -> SandboxRepr:
        value = super().__new__(cls, text)
        value.type_name = type_name
        return value

    def __repr__(self) -> str:
        return visible(str(self))


async def pickled_context(value: Any) -> bytes:
    """A context pickled for a sandbox (off the loop: a large one takes a while); one
    that cannot cross fails the run here, before any model is paid."""
    try:
        return await asyncio.to_thread(pickle.dumps, value, pickle.HIGHEST_PROTOCOL)
    except Exception as exc:  # noqa: BLE001 - any pickling failure, one line
        raise SandboxError(
            f"the context ({type(value).__name__}) cannot be sent to the "
            f"sandbox: {type(exc).__name__}: {exc}; run with --no-sandbox "
            "(RLM.sandbox = 'none')"
        ) from None


def _is_name(name: Any) -> bool:
    return (
        isinstance(name, str)
        and len(name) <= 100
        and name.isidentifier()
        and name.isascii()
        and not name.startswith("_")
    )


_DIGEST = re.compile(r"[0-9a-f]{64}")  # a replay's answer (``provenance.answer_digest``)
_TYPE_NAME = re.compile(r"[A-Za-z_][\w.]{0,59}(, [\w ]{1,60})?")


def _is_type(text: Any) -> bool:
    """A type's name, as ``carried.pack`` reports it ("dict", "function", "DataFrame,
    named as a Python builtin")."""
    return isinstance(text, str) and text.isascii() and _TYPE_NAME.fullmatch(text) is not None


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
        budget: SubCallBudget | None = None,
        pickled: bytes | None = None,
        session: SessionStart | None = None,
        launcher: Launcher = launch,
    ):
        self.context = context
        self.launcher = launcher  # starts the sandbox's process: the backend's part
        self._pickled = pickled  # the context's pickle, if the caller made it already
        # A session's variables from its last question: loaded by this sandbox only.
        self.carried = session.carried if session else None
        # A session's earlier contexts: (name, the kernel's pickle).
        self.earlier_contexts = session.earlier_contexts if session else ()
        self.carried_refused = False  # the carried variables could not be loaded safely
        # Names the context also goes by (a session's context_0): one copy, many names.
        self.context_names = ("context", *context_names)
        self.max_output_chars = max_output_chars
        self.secrets = secrets
        self.settings = settings or SandboxSettings()
        self.loop = asyncio.get_running_loop()
        self.calls = HelperCalls(helpers, self.loop, budget)
        self.last_output: StepOutput | None = None
        self.network_isolated: bool | None = None
        self.isolation: dict[str, Any] | None = None  # the layers in force (result.isolation)
        self._sandbox: SandboxProcess | None = None
        self._starting: asyncio.Task[SandboxProcess] | None = None
        self._listener: asyncio.Task[None] | None = None
        self._reply: asyncio.Future[Message] | None = None  # the one request awaiting an answer
        self._reply_op = ""
        self._step: int | None = None  # the step whose helper calls are served
        self._overdue: list[str] = []  # replies to requests that timed out
        self._closed = False

    # -- life cycle ----------------------------------------------------------------------
    async def start(self) -> None:
        """Pickle the context (a context that cannot cross fails the run here, before
        any model is paid) and begin starting the sandbox; its first use waits for it."""
        if self._pickled is None:
            self._pickled = await pickled_context(self.context)
        self._starting = self.loop.create_task(self._start())

    async def _ready(self) -> SandboxProcess:
        if self._closed:
            raise RuntimeError("this REPL is closed")
        if self._starting is None:
            raise RuntimeError("SandboxREPL.start() was not awaited")
        if self._starting.done() and self._sandbox is not None and self._sandbox.dead:
            self._starting = self.loop.create_task(self._start())
        return await asyncio.shield(self._starting)

    async def _start(self) -> SandboxProcess:
        old = self._sandbox
        if old is not None:
            if self._listener is not None:
                self._listener.cancel()
            await old.end()
        assert self._pickled is not None  # by start()
        sandbox = self._sandbox = await self.launcher(self.secrets, self.settings)
        init = bridge.frame(
            {
                "op": "init",
                "helpers": sorted(self.calls.helpers),
                "context_names": list(self.context_names),
                "carried": self.carried is not None,
                **sandbox.init_fields(self.settings, self.isolate),
            }
        )
        try:
            report = await sandbox.handshake(
                init, self._pickled, self.carried.parts if self.carried else None
            )
            self.isolation = read_isolation(report, sandbox.LAYERS)
            self.network_isolated = self.isolation["network"]
            sandbox.relays = self.isolation.get("pid") is True
            insist_on_isolation(
                self.isolation, sandbox.REQUIRED_LAYERS, self.settings.require_isolation
            )
        except BaseException as exc:  # cancelled too: no process or folder is left behind
            if isinstance(exc, CarriedRefused):
                self.carried_refused = True  # the session drops them (workspace)
            sandbox.dead = "failed to start"
            await sandbox.end()
            if isinstance(
                exc, (bridge.BridgeError, EOFError, OSError, asyncio.IncompleteReadError)
            ):
                raise SandboxError(f"the sandbox process did not start: {exc}") from None
            raise
        self._listener = self.loop.create_task(self._listen(sandbox))
        # A session's earlier contexts, each under its own name (a restart gets them too).
        for name, pickled in self.earlier_contexts:
            await self._deliver_context(sandbox, pickled, [name])
        return sandbox

    async def aclose(self) -> None:
        """End the sandbox, however the run ended; no helper call is served again."""
        self._closed = True
        self._step = None
        self.calls.cancel_all()
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
            sandbox.dead = sandbox.dead or "closed"
            sandbox.end_now()

    # -- the wire -----------------------------------------------------------------------------
    async def _listen(self, sandbox: SandboxProcess) -> None:
        """Read everything the sandbox sends, until it dies or breaks the protocol."""
        try:
            while not sandbox.dead:
                message = await sandbox.read()
                if message["op"] == "call":
                    self.calls.serve(sandbox, message, None if self._closed else self._step)
                elif message["op"] == "cancel":
                    self.calls.cancel(message.get("id"))
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
            sandbox.dead = sandbox.dead or await sandbox.exit_reason()
        except bridge.BridgeError as exc:
            sandbox.dead = sandbox.dead or f"it broke the bridge protocol: {exc}"
        except Exception as exc:  # noqa: BLE001 - anything odd from the sandbox ends it
            sandbox.dead = sandbox.dead or (
                f"it broke the bridge protocol: {type(exc).__name__}: {exc}"
            )
        sandbox.kill()
        if self._reply is not None and not self._reply.done():
            self._reply.set_exception(SandboxError(sandbox.dead))

    async def _request(self, op: str, reply_op: str, timeout: float, **fields: Any) -> Message:
        sandbox = await self._ready()
        if sandbox.dead:
            raise SandboxError(sandbox.dead)
        reply = self._expect(reply_op)
        try:
            sandbox.send({"op": op, **fields})
            return await self._await_reply(reply, reply_op, timeout)
        finally:
            self._reply = None

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
            sandbox.send({"op": "run", "step": step, "code": code, "limit": self.max_output_chars})
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
            sandbox.kill_because(str(exc))
            output.error = f"SandboxError: {sandbox.dead}" + self._lost_note(sandbox)
        finally:
            self._step = None
            self._reply = None
            # A call the step left running (from a thread or task of its code) ends
            # with it: its answer would reach no one, and it would still be billed.
            self.calls.cancel_all()
            output.elapsed_s = time.perf_counter() - started
        return output

    def _expect(self, op: str) -> asyncio.Future[Message]:
        """The future the listener resolves with the sandbox's next ``op`` message."""
        reply = self._reply = self.loop.create_future()
        self._reply_op = op
        reply.add_done_callback(lambda f: f.cancelled() or f.exception())  # retrieved
        return reply

    def _take(self, output: StepOutput, reply: Message) -> None:
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
            and finish[0] in BLOCK_FINISHES
        ):
            raise bridge.BridgeError("a step result whose finish is not [kind, answer]")
        output.finish = finish
        output.restored = (
            [name for name in restored if isinstance(name, str)][:50]
            if isinstance(restored, list)
            else []
        )

    async def _stop(
        self, sandbox: SandboxProcess, reply: asyncio.Future[Message], output: StepOutput
    ) -> None:
        """SIGINT first, which keeps the namespace; SIGKILL if the step is still running
        after the grace period. Helper calls in flight are cancelled either way."""
        self._step = None
        self.calls.cancel_all()
        sandbox.signal(signal.SIGINT)
        stopped = False
        try:
            self._take(output, await asyncio.wait_for(asyncio.shield(reply), self.STOP_GRACE_S))
            stopped = True
        except (asyncio.TimeoutError, SandboxError, bridge.BridgeError):
            pass
        finally:
            if not stopped:  # also when cancelled again meanwhile: no step left running
                sandbox.kill_because("the step did not stop, so its process was killed")

    def _lost_note(self, sandbox: SandboxProcess | None) -> str:
        if sandbox is None or not sandbox.dead:
            return ""
        if self.carried is not None:  # a session's later question
            return (
                "\nThe sandbox was restarted for your next step: every variable you made "
                "in this question is lost; the contexts, the helpers and the variables "
                "kept from earlier questions are there again."
            )
        return (
            "\nThe sandbox was restarted for your next step: every variable you made "
            "is lost; `context` and the helpers are there again."
        )

    # -- what the run reads -----------------------------------------------------------
    async def final_var(self, name: str) -> str | None:
        value = (await self._request("final_var", "final_var", timeout=30, name=name)).get("value")
        return value if isinstance(value, str) else None

    async def replay(
        self,
        codes: Sequence[str],
        variable: str | None = None,
        timeout: float = 10.0,
        answer: str | None = None,
    ) -> Replayed:
        """The reply's blocks run again in the sandbox with the data changed; the
        worker stops itself at ``timeout``, and is stopped like a step if it does not."""
        sandbox = self._sandbox
        if sandbox is None or sandbox.dead or self._closed:
            return Replayed()
        fields = {"codes": list(codes), "variable": variable, "seconds": timeout, "answer": answer}
        try:
            reply = await self._request("replay", "replay", timeout + self.STOP_GRACE_S, **fields)
        except SandboxError:
            # The worker stops its replay itself at ``timeout``; a late answer is dropped
            # (``_overdue``). No SIGINT from here: under load it could land in the next
            # step and stop it.
            return Replayed()
        digests, read_data = reply.get("digests"), reply.get("read_data")
        if not isinstance(digests, list) or len(digests) > 8:
            raise bridge.BridgeError("a replay's answer that is not a short list of digests")
        return Replayed(
            [d if isinstance(d, str) and _DIGEST.fullmatch(d) else None for d in digests],
            read_data if isinstance(read_data, bool) else None,
        )

    async def still_carried(self) -> dict[str, str | None]:
        """The carried variables this question has not set again (none if the sandbox
        cannot say): names as a variable's can be, digests as ``answer_digest`` writes."""
        if self.carried is None:
            return {}
        sandbox = self._sandbox
        if sandbox is None or sandbox.dead or self._closed:
            return {}
        held = (await self._request("carried", "carried", timeout=30)).get("held")
        if not isinstance(held, dict) or len(held) > carried.MAX_NAMES:
            raise bridge.BridgeError("carried variables that are not a short table of names")
        return {
            name: digest if isinstance(digest, str) and _DIGEST.fullmatch(digest) else None
            for name, digest in held.items()
            if _is_name(name)
        }

    async def _deliver_context(
        self, sandbox: SandboxProcess, pickled: bytes, names: list[str]
    ) -> None:
        reply = self._expect("context")
        try:
            sandbox.write(
                bridge.frame({"op": "context", "names": names})
                + bridge.pickle_frame_header(len(pickled))
                + pickled
            )
            answer = await self._await_reply(reply, "context", 60)
        finally:
            self._reply = None
        if answer.get("error"):
            raise SandboxError(str(answer["error"])[:500])

    async def carry_out(self) -> Carried:
        """The model's variables as plain data, for a session's next question (see
        ``carried.py``). The bytes are checked for size only: the kernel never loads
        them. Raises SandboxError when the sandbox cannot give them (a dead one is not
        started again for this)."""
        sandbox = self._sandbox
        if sandbox is None or sandbox.dead or self._closed:
            raise SandboxError(sandbox.dead if sandbox and sandbox.dead else "no sandbox")
        reply = await self._request("carry", "carry", timeout=30)
        parts, kept, left = reply.get("parts"), reply.get("kept"), reply.get("left")
        if reply.get("error") or not isinstance(parts, int):
            raise SandboxError(f"the variables could not be kept: {str(reply.get('error'))[:300]}")
        if not 0 <= parts <= carried.MAX_CARRIED_BYTES // carried.PART_BYTES + 2:
            raise bridge.BridgeError(f"carried variables in {parts:,} parts")
        pieces: list[bytes] = []
        size = 0
        for index in range(parts):
            part = (await self._request("carry_part", "carry_part", 30, index=index)).get("data")
            if not isinstance(part, str) or len(part) > carried.PART_BYTES * 4 // 3 + 4:
                raise bridge.BridgeError("a carried part that is not base64 of its size")
            pieces.append(base64.b64decode(part, validate=True))
            size += len(pieces[-1])
            if size > carried.MAX_CARRIED_BYTES + carried.PART_BYTES:
                raise bridge.BridgeError("carried variables past their limit")
        # Names and types go into the next question's first message, in the kernel's
        # own words: only what a variable's name and a type's name can be.
        names = [n for n in kept if _is_name(n)] if isinstance(kept, list) else []
        gone = [
            (entry[0], entry[1] if _is_type(entry[1]) else "object")
            for entry in (left if isinstance(left, list) else [])
            if isinstance(entry, list) and len(entry) == 2 and _is_name(entry[0])
        ]
        # Kept in its parts, sent in them too: never joined into a second copy.
        return carried.Carried(
            tuple(pieces), tuple(names[: carried.MAX_NAMES]), tuple(gone[: carried.MAX_NAMES])
        )

    async def set_variable(self, name: str, value: Any) -> None:
        """Put JSON data into the sandbox's namespace (only ever sent to it, as JSON).
        Framed in a thread: a long conversation (``history``) is megabytes of JSON."""
        framed = await asyncio.to_thread(bridge.frame, {"op": "set", "name": name, "value": value})
        sandbox = await self._ready()
        if sandbox.dead:
            raise SandboxError(sandbox.dead)
        reply = self._expect("set")
        try:
            sandbox.write(framed)
            await self._await_reply(reply, "set", 30)
        finally:
            self._reply = None

    async def _await_reply(
        self, reply: asyncio.Future[Message], op: str, timeout: float
    ) -> Message:
        try:
            return await asyncio.wait_for(asyncio.shield(reply), timeout)
        except asyncio.TimeoutError:
            self._overdue.append(op)  # if it still comes, it is no protocol breach
            raise SandboxError(f"the sandbox did not answer {op!r} within {timeout:g}s") from None

    async def variable_names(self) -> list[str]:
        names = (await self._request("names", "names", timeout=30)).get("names")
        return [n for n in names if isinstance(n, str)] if isinstance(names, list) else []

    async def variables(self, timeout: float = 5.0) -> dict[str, Any]:
        """The model's variables as JSON data, or ``SandboxRepr`` strings for the rest.
        Empty if the sandbox is gone or does not answer in time."""
        sandbox = self._sandbox
        if sandbox is None or sandbox.dead or self._closed:
            return {}
        try:
            data = (await self._request("variables", "variables", timeout=timeout)).get("variables")
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


if TYPE_CHECKING:
    _: type[IsolatedREPL] = SandboxREPL  # mypy checks that it has a sandbox's interface
