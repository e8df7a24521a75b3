"""A child process's standard streams as the kernel's loop reads and writes them, each
pumped by a thread of its own.

Why threads: on Windows the kernel's loop is a selector loop (tornado needs one) and
asyncio has no pipes there; a thread per stream works the same on every OS. Both are
bounded: the reader stops reading while what it holds is unread past ``HIGH_WATER``
(the child then blocks on its writes), and the writer says how much waits to be written
so the caller can stop a child that reads nothing.
"""

from __future__ import annotations

import asyncio
import os
import queue
import threading
from typing import IO

HIGH_WATER = 8 * 2**20
_CHUNK = 2**16


class PipeReader:
    """``readexactly`` from a pipe, as ``asyncio.StreamReader`` offers it."""

    def __init__(self, pipe: IO[bytes], loop: asyncio.AbstractEventLoop, name: str):
        self.loop = loop
        self._buffer = bytearray()
        self._eof = False
        self._waiter: asyncio.Future[None] | None = None
        self._room = threading.Event()  # set while the buffer is under HIGH_WATER
        self._room.set()
        self._fd = pipe.fileno()
        threading.Thread(target=self._pump, name=name, daemon=True).start()

    def _pump(self) -> None:
        while True:
            self._room.wait()
            try:
                chunk = os.read(self._fd, _CHUNK)
            except OSError:
                chunk = b""
            try:
                self.loop.call_soon_threadsafe(self._feed, chunk)
            except RuntimeError:  # the loop is closed: no one reads any more
                return
            if not chunk:
                return
            if len(self._buffer) >= HIGH_WATER:
                self._room.clear()  # (re-checked by the loop, which may set it again)
                if len(self._buffer) < HIGH_WATER:
                    self._room.set()

    def _feed(self, chunk: bytes) -> None:
        if chunk:
            self._buffer += chunk
        else:
            self._eof = True
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    async def readexactly(self, size: int) -> bytes:
        while len(self._buffer) < size:
            if self._eof:
                partial = bytes(self._buffer)
                self._buffer.clear()
                raise asyncio.IncompleteReadError(partial, size)
            self._waiter = self.loop.create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        data = bytes(self._buffer[:size])
        del self._buffer[:size]
        if len(self._buffer) < HIGH_WATER:
            self._room.set()
        return data


class PipeWriter:
    """Writes to a pipe in order, from a thread: ``write`` never blocks the loop."""

    def __init__(self, pipe: IO[bytes], name: str):
        self._pipe = pipe
        self._queue: queue.SimpleQueue[bytes | None] = queue.SimpleQueue()
        self._waiting = 0  # bytes queued and not yet written
        self._lock = threading.Lock()
        self._broken = False
        self._empty = threading.Event()  # set while nothing waits to be written
        self._empty.set()
        threading.Thread(target=self._pump, name=name, daemon=True).start()

    def _pump(self) -> None:
        while (data := self._queue.get()) is not None:
            try:
                if not self._broken:
                    self._pipe.write(data)
                    self._pipe.flush()
            except (OSError, ValueError):
                self._broken = True  # the child is gone: the reader says so
            with self._lock:
                self._waiting -= len(data)
                if not self._waiting:
                    self._empty.set()
        self._empty.set()
        try:
            self._pipe.close()
        except OSError:
            pass

    def write(self, data: bytes) -> None:
        with self._lock:
            self._waiting += len(data)
            self._empty.clear()
        self._queue.put(data)

    def waiting(self) -> int:
        return self._waiting

    async def drained(self) -> None:
        """Until everything written has gone into the pipe (or the child is gone)."""
        while not await asyncio.to_thread(self._empty.wait, 1.0):
            if self._broken:
                return

    def close(self) -> None:
        self._queue.put(None)
