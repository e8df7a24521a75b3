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
import signal
import subprocess
import sys
import threading
import time
import warnings
from collections.abc import Callable
from typing import Any

import rlm_host  # type: ignore[import-not-found]  # runner.js registers it

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
    "processes": "no subprocesses, threads or FFI: Deno runs without them",
    "memory": "WebAssembly memory is capped (RLM.sandbox_memory_mb)",
}
NO_THREADS = (
    "threads are not available in the wasm sandbox (RLM.sandbox = 'wasm'): use "
    "llm_query_batch(prompts) or asyncio.gather(...) of the awaitable helpers for concurrency"
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
        """Take one message from the kernel, waiting at most ``timeout`` seconds (None:
        until one comes) for it to begin; an interrupt that came meanwhile is raised
        here, as the process worker's SIGINT handler would."""
        worker = self.worker
        assert worker is not None
        first = rlm_host.read(1, -1 if timeout is None else max(0, timeout) * 1000)
        if first is None:
            raise SystemExit(0)  # the kernel closed the bridge
        if first.length == 0:
            if rlm_host.take_interrupt():
                _on_sigint(signal.SIGINT, None)
            return
        worker.first_byte = first.to_bytes()
        worker.take(worker.receive_json())


class WasmWorker(process_worker.Worker):
    """The process worker's requests and helper calls, over Deno's stdin and stdout."""

    def __init__(self, inbox: Pumped):
        super().__init__(None)  # type: ignore[arg-type]  # no socket: the bridge is rlm_host
        self.inbox = inbox  # type: ignore[assignment]
        self.first_byte = b""  # of a frame whose start ``Pumped.pump`` waited for

    def send_bytes(self, data: bytes) -> None:
        rlm_host.write(data)

    def read_exactly(self, size: int) -> bytes:
        parts, got = [self.first_byte[:size]], len(self.first_byte[:size])
        self.first_byte = b""
        while got < size:
            chunk = rlm_host.read(size - got, -1)
            if chunk is None:
                raise SystemExit(0)
            data = chunk.to_bytes()
            parts.append(data)
            got += len(data)
        return b"".join(parts)

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


class _BridgeSelector:
    """An event loop's idle wait, spent reading the bridge: helper answers resolve the
    futures a block's tasks await."""

    def __init__(self, inbox: Pumped):
        self.inbox = inbox

    def select(self, timeout: float | None) -> list[Any]:
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
    worker.start()
    signal.signal(signal.SIGINT, process_worker._on_sigint(worker))
    with routing_installed():  # (which wraps Thread.start: refused after it)
        _plain_python_only(inbox)
        worker.serve()
