"""A child process's standard streams as the kernel's loop reads and writes them, each
pumped by a thread of its own.

Why threads: on Windows the kernel's loop is a selector loop (tornado needs one) and
asyncio has no pipes there; a thread per stream works the same on every OS. Both are
bounded: the reader stops reading while ``HIGH_WATER`` bytes it read are not yet taken
(counted in its thread, so a busy loop cannot let it run ahead; the child then blocks on
its writes), and the writer says how much waits to be written, so the caller can stop a
child that reads nothing. ``close`` ends both threads and drops what they hold.
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
        self._pipe = pipe
        self._buffer = bytearray()  # on the loop: fed, not yet taken
        self._eof = False
        self._waiter: asyncio.Future[None] | None = None
        # Bytes read and not yet taken, counted where they are read: the thread waits
        # while there are HIGH_WATER of them.
        self._unread = 0
        self._room = threading.Condition()
        self._closed = False
        threading.Thread(target=self._pump, name=name, daemon=True).start()

    def _pump(self) -> None:
        try:
            self._read_until_the_end()
        finally:
            # Closed here, by the only thread that reads it: a close from another could
            # let a read land on the descriptor number reused meanwhile.
            try:
                self._pipe.close()
            except OSError:
                pass

    def _read_until_the_end(self) -> None:
        while True:
            with self._room:
                while self._unread >= HIGH_WATER and not self._closed:
                    self._room.wait()
                if self._closed:
                    return
            try:
                chunk = os.read(self._pipe.fileno(), _CHUNK)
            except (OSError, ValueError):  # (ValueError: closed under us)
                chunk = b""
            with self._room:
                self._unread += len(chunk)
            try:
                self.loop.call_soon_threadsafe(self._feed, chunk)
            except RuntimeError:  # the loop is closed: no one reads any more
                return
            if not chunk:
                return

    def _feed(self, chunk: bytes) -> None:
        if self._closed:
            return
        if chunk:
            self._buffer += chunk
        else:
            self._eof = True
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    async def readexactly(self, size: int) -> bytes:
        while len(self._buffer) < size:
            if self._eof or self._closed:
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
        with self._room:
            self._unread -= size
            self._room.notify()
        return data

    def close(self) -> None:
        """Stop reading and drop what was read; the thread closes the pipe as it ends
        (at once if it waits for room, at the pipe's end once the child is gone)."""
        with self._room:
            self._closed = True
            self._room.notify()
        self._buffer = bytearray()
        self._feed(b"")  # a reader still waiting gets IncompleteReadError


class PipeWriter:
    """Writes to a pipe in order, from a thread: ``write`` never blocks the loop (the
    running one, which it is made on)."""

    def __init__(self, pipe: IO[bytes], name: str):
        self.loop = asyncio.get_running_loop()
        self._pipe = pipe
        self._queue: queue.SimpleQueue[bytes | None] = queue.SimpleQueue()
        self._waiting = 0  # bytes queued and not yet written
        self._lock = threading.Lock()
        self._broken = False
        self._empty = asyncio.Event()  # on the loop: nothing waits to be written
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
                emptied = not self._waiting
            if emptied:
                self._say_empty()
        self._say_empty()
        try:
            self._pipe.close()
        except OSError:
            pass

    def _say_empty(self) -> None:
        try:
            self.loop.call_soon_threadsafe(self._set_empty)
        except RuntimeError:  # the loop is closed
            pass

    def _set_empty(self) -> None:
        if not self._waiting or self._broken:
            self._empty.set()

    def write(self, data: bytes) -> None:
        with self._lock:
            self._waiting += len(data)
        self._empty.clear()
        self._queue.put(data)

    def waiting(self) -> int:
        return self._waiting

    async def drained(self) -> None:
        """Until everything written has gone into the pipe (or the child is gone)."""
        await self._empty.wait()

    def close(self) -> None:
        self._queue.put(None)
