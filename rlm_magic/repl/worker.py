"""The sandbox process's main: one REPL namespace, served over the bridge.

Started by ``sandbox.SandboxREPL`` as ``python -I worker.py FD`` (FD: its end of the
bridge) in a fresh temporary folder with a scrubbed environment. Before it reads the
context it cuts itself off the network (a network namespace, where the OS allows it) and
caps its address space. It imports the standard library and the REPL's shared step code
only, so it starts in a few tens of milliseconds and never loads litellm.

Model code runs on the main thread, so SIGINT from the kernel raises KeyboardInterrupt
in it and keeps the namespace; a reader thread takes the kernel's messages meanwhile and
answers the helper calls that model code is blocked on.
"""

from __future__ import annotations

import os
import sys
import types


def _import_shared_code():
    """Import rlm_magic.repl's shared modules without running rlm_magic/__init__.py
    (which would load the whole package)."""
    repl_dir = os.path.dirname(os.path.abspath(__file__))
    for name, path in (("rlm_magic", os.path.dirname(repl_dir)), ("rlm_magic.repl", repl_dir)):
        package = types.ModuleType(name)
        package.__path__ = [path]
        sys.modules[name] = package


_import_shared_code()

import concurrent.futures  # noqa: E402
import contextvars  # noqa: E402
import io  # noqa: E402
import itertools  # noqa: E402
import json  # noqa: E402
import pickle  # noqa: E402
import queue  # noqa: E402
import signal  # noqa: E402
import socket  # noqa: E402
import threading  # noqa: E402

from rlm_magic.repl import bridge  # noqa: E402
from rlm_magic.repl.capture import OutputSink, routing_installed  # noqa: E402
from rlm_magic.repl.steps import (  # noqa: E402
    StepInterrupted,
    StepOutput,
    execute_step,
    final_var,
    install_helpers,
    preloaded,
    prepare_step,
    ready_answer,
    repl_builtins,
    step_filename,
    user_variables,
)

CLONE_NEWUSER, CLONE_NEWNET = 0x10000000, 0x40000000
# Output past the model's limit is not sent, but a margin is: the kernel redacts, and a
# secret straddling the cut must be seen whole to be removed whole.
_CUT_MARGIN = 8192
# result.variables: values up to this size cross as JSON, larger ones as a short repr.
_VARIABLE_JSON_LIMIT = 16 * 2**20
_VARIABLES_TOTAL_LIMIT = 96 * 2**20

_step: contextvars.ContextVar[int | None] = contextvars.ContextVar("rlm_step", default=None)


class Worker:
    def __init__(self, sock: socket.socket):
        self.sock = sock
        self.send_lock = threading.Lock()
        self.calls: dict[int, concurrent.futures.Future] = {}
        self.call_ids = itertools.count(1)
        self.calls_lock = threading.Lock()
        self.inbox: queue.SimpleQueue = queue.SimpleQueue()
        self.running = False  # SIGINT raises only while a step runs
        self.current_step: int | None = None
        self.stopped_steps: set[int] = set()
        self.stop_requested = False
        self.sink = OutputSink()
        self.namespace: dict = {}
        self.helper_names: set[str] = set()

    # -- the wire ------------------------------------------------------------------------
    def send(self, message: dict) -> None:
        data = bridge.frame(message)
        with self.send_lock:
            self.sock.sendall(data)

    def receive(self) -> tuple[bytes, bytearray]:
        kind, length = bridge.parse_header(bridge.read_exactly(self.sock, bridge.HEADER.size),
                                           limit=None, kinds=(bridge.JSON, bridge.PICKLE))
        return kind, bridge.read_exactly(self.sock, length)

    def receive_json(self) -> dict:
        kind, body = self.receive()
        if kind != bridge.JSON:
            raise bridge.BridgeError("expected a JSON message")
        return bridge.parse_json(bytes(body))

    # -- start-up --------------------------------------------------------------------------
    def start(self) -> None:
        init = self.receive_json()
        isolated, why = isolate_network() if init.get("isolate_network", True) else (
            False, "not asked for")
        limit_memory(init.get("memory_mb"))
        kind, body = self.receive()
        try:
            context = pickle.loads(body) if kind == bridge.PICKLE else None
        except Exception as exc:  # noqa: BLE001 - reported to the kernel, which fails the run
            self.send({"op": "fatal", "error": f"the context could not be unpickled in the "
                                               f"sandbox: {type(exc).__name__}: {exc} (classes "
                                               "defined in a notebook cannot cross); run "
                                               "with --no-sandbox (RLM.sandbox = 'none')"})
            raise SystemExit(1)
        del body
        self.helper_names = set(init["helpers"])
        namespace = self.namespace = {"__name__": "__rlm__", "__builtins__": repl_builtins()}
        namespace.update(preloaded(namespace, context))
        for name in init.get("context_names") or ():
            namespace[str(name)] = context  # the same object: one copy in memory
        install_helpers(namespace, sorted(self.helper_names), self.submit)
        self.send({"op": "ready", "network_isolated": isolated, "network_note": why})

    # -- helper calls ------------------------------------------------------------------------
    def submit(self, name: str, args: tuple, kwargs: dict) -> concurrent.futures.Future:
        future: concurrent.futures.Future = concurrent.futures.Future()
        with self.calls_lock:
            call_id = next(self.call_ids)
            self.calls[call_id] = future
        # A thread of a finished step (a thread pool made earlier) works for the running
        # step, as in-process; one of a stopped step stays with it, and is refused.
        step = _step.get()
        if step not in self.stopped_steps:
            step = self.current_step
        self.send({"op": "call", "id": call_id, "step": step, "name": name,
                   "args": list(args), "kwargs": kwargs})
        # Model code that stops waiting (a cancelled task, wait_for's timeout) stops the
        # call in the kernel too, as in-process: else it would run on, and be billed.
        future.add_done_callback(
            lambda done: done.cancelled() and self.send({"op": "cancel", "id": call_id}))
        return future

    def read_forever(self) -> None:
        """The reader thread: answers go to the waiting calls, requests to the main thread."""
        try:
            while True:
                message = self.receive_json()
                if message["op"] == "context":  # a pickle frame follows: a new context
                    message = self.receive_context(message)
                if message["op"] == "result":
                    with self.calls_lock:
                        future = self.calls.pop(message.get("id"), None)
                    if future is None or not future.set_running_or_notify_cancel():
                        continue  # model code stopped waiting (its task was cancelled)
                    if message.get("stopped"):
                        future.set_exception(StepInterrupted("stopped"))
                    elif "error" in message:
                        kind = TypeError if message.get("type") == "TypeError" else RuntimeError
                        future.set_exception(kind(message["error"]))
                    else:
                        future.set_result(message.get("value"))
                else:
                    self.inbox.put(message)
        except BaseException:  # noqa: BLE001 - the kernel left or broke the protocol
            # Take the processes the model's code started along (our process group).
            os.killpg(0, signal.SIGKILL)

    def receive_context(self, message: dict) -> dict:
        kind, body = self.receive()
        try:
            if kind != bridge.PICKLE:
                raise bridge.BridgeError("expected the context's pickle")
            return {**message, "value": pickle.loads(body)}
        except Exception as exc:  # noqa: BLE001 - reported to the kernel, which fails the run
            return {**message, "error": f"the context could not be unpickled in the sandbox: "
                                        f"{type(exc).__name__}: {exc}"}

    # -- requests on the main thread --------------------------------------------------------
    def serve(self) -> None:
        while True:
            message = self.inbox.get()
            op = message["op"]
            if op == "run":
                self.send(self.run_step(message))
            elif op == "final_var":
                self.send({"op": "final_var", "value": final_text(self.namespace,
                                                                  str(message.get("name")))})
            elif op == "names":
                self.send({"op": "names", "names": user_variables(self.namespace)})
            elif op == "variables":
                self.send({"op": "variables", "variables": self.variables()})
            elif op == "context":
                if "error" not in message:
                    for name in message.get("names") or ():
                        self.namespace[str(name)] = message["value"]
                self.send({"op": "context", "error": message.get("error")})
            elif op == "set":
                self.namespace[str(message.get("name"))] = message.get("value")
                self.send({"op": "set"})

    def run_step(self, message: dict) -> dict:
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
            if self.stop_requested:
                self.stopped_steps.add(step_id)
        keep = limit + _CUT_MARGIN
        parts = {"stdout": buffer.getvalue(), "value": output.value, "error": output.error}
        dropped = sum(len(text) - keep for text in parts.values() if text and len(text) > keep)
        return {"op": "done", "step": step_id, "dropped": dropped,
                "answer": ready_answer(self.namespace),
                "finish": output.finish, "restored": output.restored,
                **{key: text[:keep] if text else text for key, text in parts.items()}}

    def variables(self) -> dict:
        """The model's variables as JSON data where they are JSON-safe and not too
        large, else as a (shortened) repr."""
        out, total = {}, 0
        for name in user_variables(self.namespace):
            value = self.namespace[name]
            try:
                encoded = json.dumps(value, ensure_ascii=False, allow_nan=False)
            except (TypeError, ValueError, RecursionError):
                encoded = None
            # Limits count bytes, as the bridge does: a character may take four.
            size = _utf8_size(encoded) if encoded is not None else 0
            if encoded is not None and size <= min(
                    _VARIABLE_JSON_LIMIT, _VARIABLES_TOTAL_LIMIT - total):
                out[name], total = {"json": value}, total + size
                continue
            try:
                text = repr(value)
            except Exception as exc:  # noqa: BLE001 - a broken __repr__ is the model's
                text = f"<{type(value).__name__}: repr failed: {exc}>"
            if len(text) > 10_000:
                text = text[:10_000] + f"... [{len(text):,} characters; too large to return]"
            out[name], total = ({"repr": text, "type": type(value).__name__},
                                total + _utf8_size(text))
        return out


def _utf8_size(text: str) -> int:
    return len(text.encode("utf-8", "surrogatepass"))


# FINAL_VAR's text beyond this many bytes is cut (with a note): the bridge takes 128 MB.
_FINAL_LIMIT = 64 * 2**20


def final_text(namespace: dict, name: str) -> str | None:
    value = final_var(namespace, name)
    if value is None or len(value) * 4 <= _FINAL_LIMIT:
        return value
    size = _utf8_size(value)
    if size <= _FINAL_LIMIT:
        return value
    return (value[:_FINAL_LIMIT // 4] + f"\n... [FINAL_VAR({name}) holds {size:,} bytes, "
            f"more than the sandbox returns ({_FINAL_LIMIT:,}); the rest is cut]")


def isolate_network() -> tuple[bool, str]:
    """Move this process into a network namespace of its own: no interface but a
    loopback that is down. Root may do that directly; others need an unprivileged user
    namespace. Must run while the process has one thread."""
    if not sys.platform.startswith("linux"):
        return False, f"network namespaces are Linux-only (this is {sys.platform})"
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    errors = []
    for flags in (CLONE_NEWNET, CLONE_NEWUSER | CLONE_NEWNET):
        if libc.unshare(flags) == 0:
            return True, ""
        errors.append(os.strerror(ctypes.get_errno()))
    return False, f"unshare() refused a network namespace ({'; '.join(errors)})"


def limit_memory(megabytes) -> None:
    if not megabytes:
        return
    import resource

    limit = int(megabytes) * 2**20
    try:
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    except (ValueError, OSError):
        pass  # macOS does not take an address-space limit: the README says so


def _on_sigint(worker: Worker):
    def handler(signum, frame):
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
