"""A root turn as it streams in: its text so far (what the status panel shows), the
```repl blocks whose closing fence has arrived (what early execution may start), and
where the model begins to guess what a block prints (``seen_output``): the turn is
stopped there (``on_guess``), since what follows would be left out anyway.

``LiveTurn`` is the ``on_text`` of a streamed root call, so it runs once per chunk on
the kernel's loop: it only appends, and reads the text only when a completed line may
open or close a fence (one that starts with ``` after its indentation), or a block just
closed and the lines after it may guess its output. It reads from where the last fence
still open began, not from the start: 8,000 lines holding a backtick in an open fence
cost 31.7 s of the loop when each read the whole reply again.
"""

from __future__ import annotations

import asyncio
import dataclasses
import re
from collections.abc import Awaitable, Callable

from .finishing.seen_output import guessed_output_at
from .replies import Fence, fences_in, read_reply

# Runs block ``number`` (from 1) of the turn; returns True when the run should stop
# running this turn's code (the answer is ready).
RunBlock = Callable[[int, str], Awaitable[bool]]

# A line (as str.splitlines splits them) that may open or close a fence.
_FENCE_LINE = re.compile(r"(?:^|[\n\x0b\x0c\x1c-\x1e\x85\u2028\u2029])[ \t]*```")
_NON_BLANK = re.compile(r"\S")


class LiveTurn:
    """The streamed text of one root turn; optionally starts finished blocks early."""

    def __init__(self, run_block: RunBlock | None = None):
        self._pieces: list[str] = []
        self._run_block = run_block
        # Called once when the model begins to guess a block's output (set by the root
        # turn to stop the stream); the text is then watched even without early execution.
        self.on_guess: Callable[[], object] | None = None
        self.guessed = False
        self._codes: list[str] = []  # blocks whose closing fence has streamed in
        self._read_text: list[str] = []  # the text up to its last complete line, in parts
        self._unread: list[str] = []  # the pieces after it
        self._fence_pending = False
        self._block_closed = False  # the last line read closed a runnable block
        self._read = _ReadSoFar()
        self.ran = 0  # blocks run (or running) so far
        self.stopped = False
        self._task: asyncio.Task[None] | None = None
        # The redaction the finished reply goes through, if any: a block run early runs
        # (and is recorded) as the finished reply will hold it.
        self.redact: Callable[[str], str] | None = None

    # -- the text -------------------------------------------------------------------
    def __call__(self, piece: str | None) -> None:
        if piece is None:  # a retry: the answer starts over
            self._pieces.clear()
            # Blocks already run stay run: the retried answer must begin with them.
            self._codes = self._codes[: self.ran]
            self._read_text, self._unread = [], []
            self.guessed = self._block_closed = False
            self._read = _ReadSoFar()
            return
        self._pieces.append(piece)
        self._unread.append(piece)
        if (self._run_block is not None or self.on_guess is not None) and not self.guessed:
            self._fence_pending = self._fence_pending or "`" in piece
            if (self._fence_pending or self._block_closed) and "\n" in piece:
                self._scan()

    @property
    def text(self) -> str:
        return "".join(self._pieces)

    def tail(self, lines: int = 12, width: int = 160) -> str:
        """The last lines of the text so far, for a status view."""
        text = "".join(self._pieces[-400:])
        shown = text.splitlines()[-lines:]
        return "\n".join(line if len(line) <= width else line[: width - 1] + "…" for line in shown)

    # -- early execution ------------------------------------------------------------
    def _scan(self) -> None:
        """Queue blocks whose closing fence line is complete, and stop at a guess of
        their output. Only whole lines are parsed, so the blocks found are exactly the
        first blocks of the final text."""
        # Only the lines new since the last call are looked at, unless they may change
        # what was found (the whole text is not even joined: that alone went quadratic).
        unread = "".join(self._unread)
        cut = unread.rfind("\n") + 1
        new, rest = unread[:cut], unread[cut:]
        self._unread = [rest]
        self._fence_pending = "`" in rest
        if not new:
            return
        self._read_text.append(new)
        read = self._read
        if read.plain and "\r" in new:
            read.plain = False  # (the reader's offsets are then the normalised text's)
        if read.plain and not read.watching and not _FENCE_LINE.search(new):
            return  # no fence opened or closed, and no block's output is awaited
        whole = "".join(self._read_text)
        self._read_text = [whole]
        if read.plain:
            fences, guess = read.more(whole)
            found = read.bodies
        else:
            fences = read_reply(whole, streaming=True).fences  # the reader the run uses
            guess = guessed_output_at(whole, fences, streaming=True)
            found = [fence.body for fence in fences if fence.runnable]
        if guess is not None:
            fences = [fence for fence in fences if fence.end <= guess]
            found = [fence.body for fence in fences if fence.runnable]
            self.guessed = True
            if self.on_guess is not None:
                self.on_guess()
        self._block_closed = (
            bool(fences)
            and fences[-1].runnable
            and _NON_BLANK.search(whole, fences[-1].end) is None
        )
        run_block = self._run_block
        if run_block is None:
            return
        if len(found) > len(self._codes) and found[: self.ran] == self._codes[: self.ran]:
            self._codes = list(found)  # (the reader's own list grows)
            self._start(run_block)

    def _start(self, run_block: RunBlock) -> None:
        if self._task is None and not self.stopped:
            self._task = asyncio.ensure_future(self._work(run_block))

    async def _work(self, run_block: RunBlock) -> None:
        while self.ran < len(self._codes) and not self.stopped:
            self.ran += 1
            code = self._codes[self.ran - 1]
            if await run_block(self.ran, code if self.redact is None else self.redact(code)):
                self.stopped = True
        self._task = None

    @property
    def executed(self) -> list[str]:
        return self._codes[: self.ran]

    async def finish(self, blocks: list[str]) -> None:
        """The turn is complete: run the blocks not yet run, in order, and wait."""
        run_block = self._run_block
        if run_block is None:
            return
        executed = self.executed
        if self.redact is not None:
            executed = [self.redact(code) for code in executed]
        if blocks[: self.ran] != executed:
            raise RuntimeError(
                f"the root turn was cut off and retried after {self.ran} of its code "
                "blocks had run, and the new answer's code differs"
            )
        self._codes = list(blocks)  # a running worker picks the new ones up
        self._start(run_block)
        try:
            if self._task is not None:
                await self._task
        except BaseException:
            await self.cancel()
            raise

    async def cancel(self) -> None:
        """The turn failed or was interrupted: stop the block that is running."""
        self.stopped = True
        task, self._task = self._task, None
        if task is not None and not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)


class _ReadSoFar:
    """The closed fences of a streamed text read so far, and where reading goes on:
    the start of the fence still open, else the end of what was read. A fence that a
    later one follows is settled (the lines that say whether its output is guessed have
    all come), so only the last is looked at again for a guess."""

    def __init__(self) -> None:
        self.closed: list[Fence] = []
        self.bodies: list[str] = []  # the code of those that run
        self.resume = 0
        # No carriage return yet: the text is its normalised self, offsets agree.
        self.plain = True
        # The last closed block runs and fewer than two lines follow it: what comes
        # may guess its output, backtick or not.
        self.watching = False

    def more(self, whole: str) -> tuple[list[Fence], int | None]:
        """All closed fences of ``whole`` (which ends a line), and where a guess of a
        block's output begins, if one does: as ``read_reply`` and ``guessed_output_at``
        find them in the whole text."""
        resume = self.resume
        fresh = [
            dataclasses.replace(fence, start=fence.start + resume, end=fence.end + resume)
            for fence in fences_in(whole[resume:])
        ]
        still_open = fresh.pop() if fresh and not fresh[-1].closed else None
        looked_at = self.closed[-1:] + fresh
        self.closed += fresh
        self.bodies += (fence.body for fence in fresh if fence.runnable)
        self.resume = still_open.start if still_open is not None else len(whole)
        last = self.closed[-1] if self.closed else None
        self.watching = last is not None and last.runnable and not _two_lines_after(whole, last)
        return self.closed, guessed_output_at(whole, looked_at, streaming=True)


def _two_lines_after(text: str, fence: Fence) -> bool:
    """Whether two lines with more than whitespace follow ``fence`` in ``text``."""
    first = _NON_BLANK.search(text, fence.end)
    if first is None:
        return False
    line_end = text.find("\n", first.start())
    return line_end != -1 and _NON_BLANK.search(text, line_end) is not None
