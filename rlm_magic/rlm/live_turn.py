"""A root turn as it streams in: its text so far (what the status panel shows), the
```repl blocks whose closing fence has arrived (what early execution may start), and
where the model begins to guess what a block prints (``seen_output``): the turn is
stopped there (``on_guess``), since what follows would be left out anyway.

``LiveTurn`` is the ``on_text`` of a streamed root call, so it runs once per chunk on
the kernel's loop: it only appends, and reads the text only when a chunk ends a line
while a fence is open or right after a block closed.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from .finishing.seen_output import guessed_output_at
from .replies import read_reply

# Runs block ``number`` (from 1) of the turn; returns True when the run should stop
# running this turn's code (the answer is ready).
RunBlock = Callable[[int, str], Awaitable[bool]]


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
        self._scanned = 0  # characters of the text up to the last complete line seen
        self._fence_pending = False
        self._block_closed = False  # the last line read closed a runnable block
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
            self._scanned = 0
            self.guessed = self._block_closed = False
            return
        self._pieces.append(piece)
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
        text = self.text
        whole = text[: text.rfind("\n") + 1]
        self._fence_pending = "`" in text[len(whole) :]
        if len(whole) <= self._scanned:
            return
        self._scanned = len(whole)
        reading = read_reply(whole, streaming=True)  # the reader the run uses
        fences = reading.fences
        guess = guessed_output_at(whole, fences, streaming=True)
        if guess is not None:
            fences = [fence for fence in fences if fence.end <= guess]
            self.guessed = True
            if self.on_guess is not None:
                self.on_guess()
        self._block_closed = (
            bool(fences) and fences[-1].runnable and not whole[fences[-1].end :].strip()
        )
        found = [fence.body for fence in fences if fence.runnable]
        run_block = self._run_block
        if run_block is None:
            return
        if len(found) > len(self._codes) and found[: self.ran] == self._codes[: self.ran]:
            self._codes = found
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
