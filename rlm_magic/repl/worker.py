"""The sandbox process's main: one REPL namespace, served over the bridge.

Started by ``sandbox.SandboxREPL`` as ``python -I worker.py FD`` (FD: its end of the
bridge) in a fresh temporary folder with an allow-listed environment. Before it reads
the context it confines itself (``isolation``: namespaces, a filesystem view of its
own, limits, no capabilities, a syscall filter) and reports which layers hold. What it
sends is fitted to the bridge's frames (``fitting``). It imports the standard library
and the REPL's shared step code only, so it starts in a few tens of milliseconds and
never loads litellm.

Model code runs on the main thread, so SIGINT from the kernel raises KeyboardInterrupt
in it and keeps the namespace; a reader thread takes the kernel's messages meanwhile and
answers the helper calls that model code is blocked on.

Why one module: it is the sandbox process's whole side of the bridge's protocol (each
request the kernel sends and its answer), run as a script by a bare ``python -I``; the
work of each request lives in the shared modules it imports.
"""

from __future__ import annotations

import os
import sys
import types


def _import_shared_code() -> None:
    """Import rlm_magic.repl's shared modules without running rlm_magic/__init__.py
    (which would load the whole package)."""
    repl_dir = os.path.dirname(os.path.abspath(__file__))
    for name, path in (("rlm_magic", os.path.dirname(repl_dir)), ("rlm_magic.repl", repl_dir)):
        package = types.ModuleType(name)
        package.__path__ = [path]
        sys.modules[name] = package


_import_shared_code()

import _thread  # noqa: E402
import base64  # noqa: E402
import concurrent.futures  # noqa: E402
import contextvars  # noqa: E402
import io  # noqa: E402
import itertools  # noqa: E402
import pickle  # noqa: E402
import queue  # noqa: E402
import signal  # noqa: E402
import socket  # noqa: E402
import threading  # noqa: E402
from collections.abc import Callable  # noqa: E402
from types import FrameType  # noqa: E402
from typing import Any  # noqa: E402

from rlm_magic.repl import bridge, carried  # noqa: E402
from rlm_magic.repl.bridge import Message  # noqa: E402
from rlm_magic.repl.capture import OutputSink, routing_installed  # noqa: E402
from rlm_magic.repl.fitting import (  # noqa: E402
    VARIABLES_MOST,
    batch_parts,
    fitted,
    fitted_finish,
    fitted_variables,
    joined,
    listed_batch,
)
from rlm_magic.repl.helpers import BATCH_NAMES  # noqa: E402
from rlm_magic.repl.provenance import (  # noqa: E402
    Replayed,
    Undecidable,
    assigned_names,
    carried_digests,
    replay,
    replaying,
)
from rlm_magic.repl.steps import (  # noqa: E402
    StepInterrupted,
    StepOutput,
    compile_step,
    execute_step,
    final_var,
    install_helpers,
    preloaded,
    prepare_step,
    repl_builtins,
    step_filename,
    user_variables,
)

# Output past the model's limit is not sent, but a margin is: the kernel redacts, and a
# secret straddling the cut must be seen whole to be removed whole.
_CUT_MARGIN = 8192
_step: contextvars.ContextVar[int | None] = contextvars.ContextVar("rlm_step", default=None)


class Worker:
    # What to do about a context that does not unpickle here.
    UNPICKLED_HINT = (
        "classes defined in a notebook cannot cross: run with --no-sandbox (RLM.sandbox = 'none')"
    )

    def __init__(self, sock: socket.socket):
        self.sock = sock
        self.send_lock = threading.Lock()
        # By call id; the kernel's answers name one, looked up as sent.
        self.calls: dict[Any, concurrent.futures.Future[Any]] = {}
        self.call_ids = itertools.count(1)
        self.calls_lock = threading.Lock()
        self.parts: dict[Any, list[Any]] = {}  # of answers that come in parts, by call id
        self.inbox: queue.SimpleQueue[Message] = queue.SimpleQueue()
        self.running = False  # SIGINT raises only while a step runs
        self.current_step: int | None = None
        self.stopped_steps: set[int] = set()
        self.stop_requested = False
        self.sink = OutputSink()
        self.namespace: dict[str, Any] = {}
        self.helper_names: set[str] = set()
        self.carry_parts: list[bytes] = []

    # -- the wire ------------------------------------------------------------------------
    def send(self, message: Message) -> None:
        self.send_bytes(bridge.frame(message))

    def send_bytes(self, data: bytes) -> None:
        with self.send_lock:
            self.sock.sendall(data)

    def read_exactly(self, size: int) -> bytes | bytearray:
        return bridge.read_exactly(self.sock, size)

    def receive(self) -> tuple[bytes, bytes | bytearray]:
        kind, length = bridge.parse_header(
            self.read_exactly(bridge.HEADER.size),
            limit=None,
            kinds=(bridge.JSON, bridge.PICKLE, bridge.DATA),
        )
        return kind, self.read_exactly(length)

    def receive_json(self) -> Message:
        kind, body = self.receive()
        if kind != bridge.JSON:
            raise bridge.BridgeError("expected a JSON message")
        return bridge.parse_json(bytes(body))

    # -- start-up --------------------------------------------------------------------------
    def start(self) -> None:
        init = self.receive_json()
        try:
            report = self.confine(init)
        except Exception as exc:  # noqa: BLE001 - reported to the kernel, which fails the run
            self.send(
                {
                    "op": "fatal",
                    "error": f"the sandbox could not confine itself: {type(exc).__name__}: {exc}",
                }
            )
            raise SystemExit(1) from None
        kind, body = self.receive()
        try:
            context = pickle.loads(body) if kind == bridge.PICKLE else None
        except Exception as exc:  # noqa: BLE001 - reported to the kernel, which fails the run
            self.send(
                {
                    "op": "fatal",
                    "error": f"the context could not be unpickled in the "
                    f"sandbox: {type(exc).__name__}: {exc}; {self.UNPICKLED_HINT}",
                }
            )
            raise SystemExit(1) from None
        del body
        self.helper_names = set(init["helpers"])
        namespace = self.namespace = {"__name__": "__rlm__", "__builtins__": repl_builtins()}
        refused = None
        self.carried_in: dict[str, Any] = {}  # what an earlier question left, as it left it
        if init.get("carried"):  # a session's variables from its last question, as data
            variables, refused = self.receive_carried()
            namespace.update(variables)
            self.carried_in = dict(variables)
        namespace.update(preloaded(namespace, context))
        for name in init.get("context_names") or ():
            namespace[str(name)] = context  # the same object: one copy in memory
        install_helpers(namespace, sorted(self.helper_names), self.submit)
        self.send({"op": "ready", "isolation": report, "carried_refused": refused})

    def receive_carried(self) -> tuple[dict[str, Any], str | None]:
        """The carried variables, or none and why they were refused. The kernel times
        their loading from the "unpacking" message on."""
        kind, body = self.receive()
        if kind != bridge.DATA:
            raise bridge.BridgeError("expected the carried variables")
        self.send({"op": "unpacking"})
        try:
            return carried.unpack(bytes(body)), None
        except Exception as exc:  # noqa: BLE001 - refused whole, and said
            return {}, f"{type(exc).__name__}: {exc}"[:300]

    def confine(self, init: Message) -> dict[str, Any]:
        """Apply the isolation layers in their order (see isolation/order.py); the
        kernel maps our ids in between when it runs as root. (Imported here: the wasm
        worker, which shares this module, has no ``resource`` to import it with.)"""
        from rlm_magic.repl import isolation

        def ask_the_kernel_to_map_ids(needs_ids: bool) -> bool:
            self.send({"op": "unshared", "map_ids": needs_ids})
            return self.receive_json().get("mapped") is True

        report = isolation.confine(
            isolation.Policy(**init["policy"]),
            enabled=init.get("isolate", True),
            bridge_fd=self.sock.fileno(),
            map_ids=ask_the_kernel_to_map_ids,
        )
        return report.as_dict()

    # -- helper calls ------------------------------------------------------------------------
    def submit(
        self, name: str, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> concurrent.futures.Future[Any]:
        future: concurrent.futures.Future[Any] = concurrent.futures.Future()
        if replaying():  # a helper the model's code kept under another name: no real call
            future.set_exception(Undecidable("a replay makes no sub-call"))
            return future
        args = listed_batch(name, args)
        if (
            name in BATCH_NAMES
            and args
            and isinstance(args[0], list)
            and len(args[0]) > bridge.MAX_VALUES // 2
        ):
            future.set_exception(
                ValueError(
                    f"{name}(): {len(args[0]):,} prompts, more than one call takes "
                    f"({bridge.MAX_VALUES // 2:,}); RLM.max_sub_calls allows far fewer anyway"
                )
            )
            return future
        with self.calls_lock:
            call_id = next(self.call_ids)
        # A thread of a finished step (a thread pool made earlier) works for the running
        # step, as in-process; one of a stopped step stays with it, and is refused.
        step = _step.get()
        if step not in self.stopped_steps:
            step = self.current_step
        data = bridge.frame(
            {
                "op": "call",
                "id": call_id,
                "step": step,
                "name": name,
                "args": list(args),
                "kwargs": kwargs,
            }
        )
        too_big = bridge.oversize(data[bridge.HEADER.size :])
        if too_big:  # a batch goes in parts that fit; anything else is refused here
            parts = batch_parts(name, args, kwargs)
            if parts is None:
                future.set_exception(ValueError(f"{name}(): {too_big}; send less per call"))
                return future
            return joined(
                [self.submit(name, part_args, part_kwargs) for part_args, part_kwargs in parts]
            )
        with self.calls_lock:
            self.calls[call_id] = future
        self.send_bytes(data)

        # Model code that stops waiting (a cancelled task, wait_for's timeout) stops the
        # call in the kernel too, as in-process: else it would run on, and be billed.
        def stop_in_the_kernel(done: concurrent.futures.Future[Any]) -> None:
            if done.cancelled():
                self.send({"op": "cancel", "id": call_id})

        future.add_done_callback(stop_in_the_kernel)
        return future

    def read_forever(self) -> None:
        """The reader thread: answers go to the waiting calls, requests to the main thread."""
        try:
            while True:
                self.take(self.receive_json())
        except BaseException:  # noqa: BLE001 - the kernel left or broke the protocol
            # Take the processes the model's code started along (our process group),
            # and end: as pid 1 of a PID namespace this process outlives its own SIGKILL,
            # and its exit ends every process left in the namespace.
            os.killpg(0, signal.SIGKILL)
            os._exit(1)

    def take(self, message: Message) -> None:
        """One message from the kernel: an answer goes to its call, a request to
        ``inbox`` for the main thread."""
        if message["op"] == "context":  # a pickle frame follows: a new context
            message = self.receive_context(message)
        if message["op"] == "result_part":  # a large answer comes in parts
            with self.calls_lock:
                self.parts.setdefault(message.get("id"), []).append(message.get("value"))
            return
        if message["op"] != "result":
            self.inbox.put(message)
            return
        with self.calls_lock:
            future = self.calls.pop(message.get("id"), None)
            parts = self.parts.pop(message.get("id"), [])
        if "joined" in message:
            message["value"] = _joined(message["joined"], [*parts, message["value"]])
        if future is None or not future.set_running_or_notify_cancel():
            return  # model code stopped waiting (its task was cancelled)
        if message.get("stopped"):
            future.set_exception(StepInterrupted("stopped"))
        elif "error" in message:
            kind = TypeError if message.get("type") == "TypeError" else RuntimeError
            future.set_exception(kind(message["error"]))
        else:
            future.set_result(_with_refused(message))

    def receive_context(self, message: Message) -> Message:
        kind, body = self.receive()
        try:
            if kind != bridge.PICKLE:
                raise bridge.BridgeError("expected the context's pickle")
            return {**message, "value": pickle.loads(body)}
        except Exception as exc:  # noqa: BLE001 - reported to the kernel, which fails the run
            return {
                **message,
                "error": f"the context could not be unpickled in the sandbox: "
                f"{type(exc).__name__}: {exc}",
            }

    # -- requests on the main thread --------------------------------------------------------
    def serve(self) -> None:
        handlers: dict[str, Callable[[Message], Message]] = {
            "run": self.run_step,
            "final_var": lambda message: {
                "op": "final_var",
                "value": final_text(self.namespace, str(message.get("name"))),
            },
            "replay": lambda message: {"op": "replay", **self.replay(message).as_message()},
            "carried": lambda _: {
                "op": "carried",
                "held": carried_digests(self.namespace, self.carried_in),
            },
            "names": lambda _: {
                "op": "names",
                "names": user_variables(self.namespace)[:VARIABLES_MOST],
            },
            "variables": lambda _: {
                "op": "variables",
                "variables": fitted_variables(self.namespace),
            },
            "context": self.set_context,
            "set": self.set_variable,
            "carry": lambda _: self.carry_out(),
            "carry_part": self.carry_part,
        }
        while True:
            message = self.inbox.get()
            handler = handlers.get(message["op"])
            if handler is not None:  # (an op this worker does not know: nothing to say)
                self.send(handler(message))

    def set_context(self, message: Message) -> Message:
        if "error" not in message:
            for name in message.get("names") or ():
                self.namespace[str(name)] = message["value"]
        return {"op": "context", "error": message.get("error")}

    def set_variable(self, message: Message) -> Message:
        self.namespace[str(message.get("name"))] = message.get("value")
        return {"op": "set"}

    def carry_part(self, message: Message) -> Message:
        index = int(message.get("index", 0))
        part = self.carry_parts[index] if 0 <= index < len(self.carry_parts) else b""
        return {"op": "carry_part", "data": base64.b64encode(part).decode("ascii")}

    def replay(self, message: Message) -> Replayed:
        """The reply's blocks run again with the data changed (``provenance``), stopped
        like a step when its ``seconds`` are up: a digest of the answer in each world."""
        codes = [str(code) for code in message.get("codes") or ()]
        variable = message.get("variable")
        seconds = float(message.get("seconds") or 0)
        self.running, self.stop_requested = True, False
        cancel = self.stop_after(seconds)
        try:
            return replay(
                codes,
                self.namespace,
                self.helper_names,
                compile_step,
                variable=None if variable is None else str(variable),
                fit=fitted_finish,
                answer=message["answer"] if isinstance(message.get("answer"), str) else None,
            )
        except (KeyboardInterrupt, StepInterrupted, SyntaxError):
            return Replayed()
        finally:
            self.running = False
            cancel()

    def stop_after(self, seconds: float) -> Callable[[], None]:
        """Interrupt the main thread in ``seconds`` (as the kernel's SIGINT would), unless
        the returned function is called first."""
        timer = threading.Timer(seconds, _thread.interrupt_main, (signal.SIGINT,))
        timer.start()
        return timer.cancel

    def carry_out(self) -> Message:
        """The model's variables as plain data, for the session's next question: how
        many parts the kernel fetches, and what stays behind."""
        try:
            data, kept, left = carried.pack(self.namespace)
        except Exception as exc:  # noqa: BLE001 - said to the kernel, which keeps the last
            self.carry_parts = []
            return {"op": "carry", "error": f"{type(exc).__name__}: {exc}"[:300]}
        self.carry_parts = [
            data[at : at + carried.PART_BYTES] for at in range(0, len(data), carried.PART_BYTES)
        ]
        return {"op": "carry", "parts": len(self.carry_parts), "kept": kept, "left": left}

    def run_step(self, message: Message) -> Message:
        step_id, limit = int(message["step"]), int(message["limit"])
        output, buffer = StepOutput(code=message["code"]), io.StringIO()
        compiled = prepare_step(output.code, self.helper_names, step_filename(step_id), output)
        token = _step.set(step_id)
        self.current_step, self.stop_requested = step_id, False
        try:
            try:
                self.running = True
                if compiled is not None:
                    execute_step(compiled, self.namespace, output, buffer, self.sink)
            finally:
                self.running = False
        except (KeyboardInterrupt, StepInterrupted):
            output.error = "KeyboardInterrupt: the step was stopped"
        finally:
            _step.reset(token)
            self.current_step = None
            for name in assigned_names(output.code) if self.carried_in else ():
                self.carried_in.pop(name, None)  # this question's variable now
            if self.stop_requested:
                self.stopped_steps.add(step_id)
        keep = min(limit + _CUT_MARGIN, _STEP_TEXT_LIMIT)
        parts = {"stdout": buffer.getvalue(), "value": output.value, "error": output.error}
        dropped = sum(len(text) - keep for text in parts.values() if text and len(text) > keep)
        return {
            "op": "done",
            "step": step_id,
            "dropped": dropped,
            # The answer of a block that finished the run, fitted beside the
            # step's texts so the frame stays under the bridge's limit.
            "finish": fitted_finish(output.finish),
            "restored": output.restored,
            **{key: text[:keep] if text else text for key, text in parts.items()},
        }


# Each text of a step's result (output, value, error) is cut to this many characters
# at most, whatever max_output_chars says: the three fit one frame.
_STEP_TEXT_LIMIT = 2**17  # x 12 bytes (an escaped astral character) x 3 < 8 MB


def final_text(namespace: dict[str, Any], name: str) -> str | None:
    value = final_var(namespace, name)
    return None if value is None else fitted(value, f"FINAL_VAR({name})")


def _joined(kind: str, parts: list[Any]) -> Any:
    """An answer sent in parts, whole again (``sandbox.calls._split``)."""
    if kind == "text":
        return "".join(parts)
    if kind == "list":
        return [item for part in parts for item in part]
    return parts[-1]


def _with_refused(message: Message) -> Any:
    """A batch's answers, and an error string for each prompt the kernel refused (over
    the run's sub-call budget) without expanding it."""
    value, refused = message.get("value"), message.get("refused")
    if isinstance(value, list) and isinstance(refused, dict):
        count = refused.get("count")
        if isinstance(count, int) and 0 < count <= bridge.MAX_VALUES:
            value = value + [str(refused.get("error"))] * count
    return value


def _on_sigint(worker: Worker) -> Callable[[int, FrameType | None], None]:
    def handler(signum: int, frame: FrameType | None) -> None:
        if worker.running:
            worker.stop_requested = True
            # Not KeyboardInterrupt: the model's code may raise that itself, and a
            # stop must read as a stop, that as the code's own error.
            raise StepInterrupted("stopped")

    return handler


def main() -> None:
    sock = socket.socket(fileno=int(sys.argv[1]))
    worker = Worker(sock)
    try:
        worker.start()
    except (EOFError, OSError, bridge.BridgeError):
        os._exit(1)
    signal.signal(signal.SIGINT, _on_sigint(worker))
    threading.Thread(target=worker.read_forever, name="rlm-bridge", daemon=True).start()
    with routing_installed():
        worker.serve()
    os._exit(0)


if __name__ == "__main__":
    main()
