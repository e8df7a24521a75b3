"""The wasm sandbox's worker: ``repl/worker.py``'s ``Worker``, run by Pyodide on Deno's
main thread, with no threads to lean on.

Where the process worker has a reader thread, this one pumps the bridge itself whenever
it would wait: for the kernel's next request, for a helper call's answer
(``concurrent.futures.Future.result`` pumps here), and in the event loop that runs a
block's top-level ``await`` (``BridgeLoop``, whose idle wait is a wait on the bridge).
Reading stdin, and the kernel's interrupts, happen on a thread of Deno's (``reader.js``);
``rlm_host`` is the main thread's side of it (``runner.js``).

Runs inside Pyodide only: ``rlm_host`` exists nowhere else.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import importlib.abc
import os
import signal
import subprocess
import sys
import threading
import time
import warnings
from collections.abc import Callable
from typing import Any

import rlm_host  # type: ignore[import-not-found]  # runner.js registers it

from rlm_magic.repl import bridge
from rlm_magic.repl import worker as process_worker
from rlm_magic.repl.bridge import Message
from rlm_magic.repl.capture import routing_installed

# What the layers are, as ``result.isolation`` reports them for this backend.
LAYERS = {
    "webassembly": "model code is CPython compiled to WebAssembly: it reaches the host "
    "only through what JavaScript is given",
    "filesystem": "Deno may read Pyodide's own files only, and not even those once it "
    "has loaded; files model code writes live in memory",
    "network": "Deno runs without network permission",
    "environment": "Deno starts with an empty environment and may not read it",
    "processes": "no subprocesses, Python threads or FFI: Deno runs without them (Web "
    "Workers model code starts hold the same permissions and end with the sandbox)",
    "memory": "WebAssembly memory is capped (RLM.sandbox_memory_mb), and the process's "
    "by a data limit of that much past what Deno holds when ready (Linux)",
}
NO_THREADS = (
    "threads are not available in the wasm sandbox (RLM.sandbox = 'wasm'): use "
    "llm_query_batch(prompts) or asyncio.gather(...) of the awaitable helpers for concurrency"
)
NOTHING_COMES = (
    "this step waits for what nothing will bring: no helper call is out and nothing is "
    "scheduled (a JavaScript promise, as js.fetch(...) returns, never settles in the wasm "
    "sandbox, whose JavaScript event loop does not turn while Python runs)"
)
NO_PROCESSES = "subprocesses are not available in the wasm sandbox (RLM.sandbox = 'wasm')"


class Pumped:
    """The bridge read a frame at a time on this thread: requests wait in ``inbox``."""

    def __init__(self) -> None:
        self.worker: WasmWorker | None = None
        self.waiting: collections.deque[Message] = collections.deque()

    def put(self, message: Message) -> None:
        self.waiting.append(message)

    def get(self) -> Message:
        while not self.waiting:
            self.pump(None)
        return self.waiting.popleft()

    def pump(self, timeout: float | None) -> None:
        """Take what the kernel sent, waiting at most ``timeout`` seconds (None: until
        something comes) for it to begin: every whole frame read, each answer to its
        call. An interrupt that came meanwhile is raised here, between frames, as the
        process worker's SIGINT handler would; one that comes while a frame is read
        waits for its end (raised halfway, it would leave half a frame unread)."""
        worker = self.worker
        assert worker is not None
        worker.flush()
        if not worker.buffer and not worker.more(-1 if timeout is None else timeout * 1000):
            if rlm_host.take_interrupt():
                _on_sigint(signal.SIGINT, None)
            return
        worker.framing = True
        try:
            worker.take(worker.receive_json())
            while worker.whole_frame_buffered():
                worker.take(worker.receive_json())
        finally:
            worker.framing = False
        if worker.interrupted:
            worker.interrupted = False
            _on_sigint(signal.SIGINT, None)


class WasmWorker(process_worker.Worker):
    """The process worker's requests and helper calls, over Deno's stdin and stdout."""

    UNPICKLED_HINT = (
        "the wasm sandbox has the standard library only: pass plain data, such as "
        "df.to_dict('records'), or run with RLM.sandbox = 'process'"
    )

    def __init__(self, inbox: Pumped):
        super().__init__(None)  # type: ignore[arg-type]  # no socket: the bridge is rlm_host
        self.outbox: list[bytes] = []  # frames not yet written
        self.inbox = inbox  # type: ignore[assignment]
        self.buffer = bytearray()  # read from the kernel, not yet taken
        self.framing = False  # a frame is being read: an interrupt waits for its end
        self.interrupted = False  # one that came meanwhile

    def send_bytes(self, data: bytes) -> None:
        # Kept until this worker next waits for the kernel (``flush``): the 64 calls of
        # an asyncio.gather go in one write, not 64 (a write costs ~0.1 ms here).
        self.outbox.append(data)

    def flush(self) -> None:
        if self.outbox:
            data, self.outbox[:] = b"".join(self.outbox), []
            rlm_host.write(data)

    def more(self, ms: float) -> bool:
        """Read what the kernel sent (a megabyte at most), waiting up to ``ms`` (forever
        if negative) for it; False if nothing came: the time was up, or (while no frame
        is being read) an interrupt came."""
        chunk = rlm_host.read(2**20, ms, not self.framing)
        if chunk is None:
            raise SystemExit(0)  # the kernel closed the bridge
        if chunk.length == 0:
            return False
        self.buffer += chunk.to_bytes()
        return True

    def read_exactly(self, size: int) -> bytes:
        self.flush()
        while len(self.buffer) < size:
            self.more(-1)
        data = bytes(self.buffer[:size])
        del self.buffer[:size]
        return data

    def whole_frame_buffered(self) -> bool:
        if len(self.buffer) < bridge.HEADER.size:
            return False
        length: int = bridge.HEADER.unpack_from(self.buffer)[1]
        return len(self.buffer) >= bridge.HEADER.size + length

    def confine(self, init: Message) -> dict[str, Any]:
        """Nothing to apply: Deno was started confined. What holds, said."""
        return {"layers": dict.fromkeys(LAYERS, True), "notes": dict(LAYERS)}

    def stop_after(self, seconds: float) -> Callable[[], None]:
        rlm_host.alarm(seconds * 1000)
        return lambda: rlm_host.alarm(0)


def _on_sigint(signum: int, frame: Any) -> None:
    handler = signal.getsignal(signal.SIGINT)
    if callable(handler):
        handler(signum, frame)


def _held_while_framing(worker: WasmWorker) -> Callable[[int, Any], None]:
    """The process worker's SIGINT handler, held while a frame is read (``pump``)."""
    stop = process_worker._on_sigint(worker)

    def handler(signum: int, frame: Any) -> None:
        if worker.framing:
            worker.interrupted = True
        else:
            stop(signum, frame)

    return handler


class _BridgeSelector:
    """An event loop's idle wait, spent reading the bridge: helper answers resolve the
    futures a block's tasks await."""

    def __init__(self, inbox: Pumped):
        self.inbox = inbox

    def select(self, timeout: float | None) -> list[Any]:
        worker = self.inbox.worker
        if timeout is None and worker is not None and not worker.calls:
            # Nothing scheduled and no helper call out: only JavaScript could end this
            # wait (an awaited js.fetch(...)), and its loop does not turn while Python runs.
            raise RuntimeError(NOTHING_COMES)
        self.inbox.pump(timeout)
        return []

    def close(self) -> None:
        pass


class BridgeLoop(asyncio.BaseEventLoop):
    """The loop ``asyncio.run`` makes for a block's top-level ``await``: Pyodide's own
    loop needs the JavaScript event loop, which a running block holds."""

    inbox: Pumped

    def __init__(self) -> None:
        super().__init__()
        self._selector = _BridgeSelector(self.inbox)

    def _process_events(self, event_list: list[Any]) -> None:
        pass

    def _write_to_self(self) -> None:
        pass  # one thread: the loop is not asleep while anything calls it


def _pumping_result(inbox: Pumped) -> None:
    """``Future.result()`` and ``exception()`` read the bridge while they wait: there is
    no other thread to set the answer."""
    future = concurrent.futures.Future
    original_result, original_exception = future.result, future.exception

    def wait(self: concurrent.futures.Future[Any], timeout: float | None) -> None:
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self.done():
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise concurrent.futures.TimeoutError()
            inbox.pump(left)

    def result(self: concurrent.futures.Future[Any], timeout: float | None = None) -> Any:
        wait(self, timeout)
        return original_result(self, 0)

    def exception(
        self: concurrent.futures.Future[Any], timeout: float | None = None
    ) -> BaseException | None:
        wait(self, timeout)
        return original_exception(self, 0)

    future.result = result  # type: ignore[method-assign]
    future.exception = exception  # type: ignore[method-assign]


class _NoNativeModules(importlib.abc.MetaPathFinder):
    """Last on the import path: a module this Pyodide does not have fails in one line
    that says why, not only "No module named ..."."""

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> None:
        if "." not in name:
            raise ModuleNotFoundError(
                f"No module named {name!r}: the wasm sandbox (RLM.sandbox = 'wasm') has "
                "the standard library only; use RLM.sandbox = 'process' for other packages",
                name=name,
            )


def _refuse(message: str, kind: type[Exception]) -> Callable[..., Any]:
    def refused(*args: Any, **kwargs: Any) -> Any:
        raise kind(message)

    return refused


def _plain_python_only(inbox: Pumped) -> None:
    """What model code cannot do here fails in one clear line."""
    threading.Thread.start = _refuse(NO_THREADS, RuntimeError)  # type: ignore[method-assign]
    subprocess.Popen.__init__ = _refuse(NO_PROCESSES, OSError)  # type: ignore[method-assign]
    # Emscripten's system() asks Node for a shell: Deno's refusal (no env, no run) is a
    # JavaScript error that unwinds through Python and ends the whole sandbox.
    os.system = _refuse(NO_PROCESSES, OSError)
    sys.meta_path.append(_NoNativeModules())
    time.sleep = lambda seconds: _sleep(inbox, float(seconds))
    BridgeLoop.inbox = inbox
    asyncio.run = _run  # a block's top-level await
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        asyncio.set_event_loop_policy(_BridgePolicy())  # and a loop model code makes


def _run(main: Any, *, debug: bool | None = None, loop_factory: Any = None) -> Any:
    """``asyncio.run`` on a ``BridgeLoop`` (Pyodide's own ``run`` needs to switch
    stacks, which a block run from the bridge cannot)."""
    webloop = asyncio.events._get_running_loop()  # Pyodide's, always "running"
    asyncio.events._set_running_loop(None)
    try:
        # (Pyodide's Python is 3.14: asyncio.Runner is there.)
        with asyncio.Runner(debug=debug, loop_factory=BridgeLoop) as runner:  # type: ignore[attr-defined]
            return runner.run(main)
    finally:
        asyncio.events._set_running_loop(webloop)


# (Named with an underscore from Python 3.14 on.)
_PolicyBase: Any = vars(asyncio.events).get("BaseDefaultEventLoopPolicy") or vars(
    asyncio.events
).get("_BaseDefaultEventLoopPolicy")


class _BridgePolicy(_PolicyBase):  # type: ignore[misc]
    _loop_factory = BridgeLoop


def _sleep(inbox: Pumped, seconds: float) -> None:
    """``time.sleep`` that an interrupt ends, as it would a real one."""
    deadline = time.monotonic() + max(0.0, float(seconds))
    while (left := deadline - time.monotonic()) > 0:
        rlm_host.sleep(left * 1000)
        if rlm_host.take_interrupt():
            _on_sigint(signal.SIGINT, None)


def main(_exactly: Any = None) -> None:
    inbox = Pumped()
    worker = inbox.worker = WasmWorker(inbox)
    _pumping_result(inbox)
    try:
        worker.start()
        signal.signal(signal.SIGINT, _held_while_framing(worker))
        with routing_installed():  # (which wraps Thread.start: refused after it)
            _plain_python_only(inbox)
            worker.serve()
    finally:
        worker.flush()  # a 'fatal' said on the way out
