"""``Completion``: a model's answer as every caller of the client receives it; and
``CutAnswer``, the text of an answer that is not whole, as code can tell it apart."""

from __future__ import annotations

from asyncio import CancelledError
from dataclasses import dataclass
from typing import Any


class CutAnswer(str):
    """The text of an answer that ended before the model meant it to: it stopped at
    ``max_tokens``, or broke off (a stall, the step's deadline, a server gone, an
    interrupt). It is a ``str`` as before; code tells it apart without parsing it::

        answer = await llm_query(prompt)
        if isinstance(answer, CutAnswer):
            print(answer.reason, len(answer.text))

    - ``text``: what arrived, without a marker;
    - ``reason``: why it is not whole, in plain words;
    - ``broken_off``: True unless it stopped at ``max_tokens``.

    The string itself is what arrived, followed by ``[answer cut off: reason]`` when it
    broke off, so that ``int(answer)`` or ``json.loads(answer)`` fails rather than
    reading a cut number or document as whole. (An answer at ``max_tokens`` carries no
    marker: that is where it was asked to end.)
    """

    text: str
    reason: str
    broken_off: bool

    def __new__(cls, text: str, reason: str, *, broken_off: bool = True) -> CutAnswer:
        value = f"{text}\n[answer cut off: {reason}]" if broken_off else text
        self = super().__new__(cls, value)
        self.text, self.reason, self.broken_off = str(text), reason, broken_off
        return self

    def __reduce__(self) -> tuple[Any, ...]:  # pickled (a DataFrame saved) as itself
        return (_cut_answer, (self.text, self.reason, self.broken_off))


def _cut_answer(text: str, reason: str, broken_off: bool) -> CutAnswer:
    return CutAnswer(text, reason, broken_off=broken_off)


# Why an answer cut by an interrupt is not whole (its ``CutAnswer.reason``).
INTERRUPTED = "interrupted"


def partial_answer(cancel: BaseException) -> Completion | None:
    """The ``Completion`` a call had received, recorded, when ``cancel`` (an interrupt)
    stopped it mid-answer; None if nothing had arrived. The client hangs it on the
    cancellation, which goes on up: whoever keeps a batch's answers keeps it too.

    Read from ``cancel`` or the cancellations it was raised in: awaiting a cancelled task
    gives Python 3.10 a new ``CancelledError`` whose ``__context__`` is the task's own
    (3.11 on re-raise the task's own). Whoever can, reads it inside the task that was
    cancelled (``run_interruptibly`` and the maps do), not across a task's edge.
    """
    seen: set[int] = set()
    error: BaseException | None = cancel
    while error is not None and id(error) not in seen:
        cut = getattr(error, "partial_answer", None)
        if isinstance(cut, Completion):
            return cut
        seen.add(id(error))
        # Only a cancellation raised in handling this one: not another call's story.
        error = error.__context__ if isinstance(error.__context__, CancelledError) else None
    return None


@dataclass(frozen=True)
class Completion:
    """A model's answer and what it cost. The ``text`` of one that is not whole is a
    ``CutAnswer``."""

    text: str
    model: str
    input_tokens: int = 0
    output_tokens: int = 0
    cost_usd: float | None = None
    retries: int = 0
    elapsed_s: float = 0.0
    cached: bool = False
    cached_input_tokens: int = 0  # served from the provider's prompt cache
    cache_write_tokens: int = 0
    streamed: bool = False
    finish_reason: str | None = None  # "length": the answer stopped at max_tokens
    # Why a streamed answer broke off before its end (a stall, the step's deadline, a
    # server gone, an interrupt): ``text`` is what had arrived, marked (``CutAnswer``).
    cut_reason: str | None = None

    def __post_init__(self) -> None:
        if isinstance(self.text, CutAnswer):
            return
        if self.cut_reason is not None:
            cut = CutAnswer(self.text, self.cut_reason)
        elif self.finish_reason == "length":
            cut = CutAnswer(self.text, "it reached its max_tokens", broken_off=False)
        else:
            return
        object.__setattr__(self, "text", cut)

    @property
    def cut_off(self) -> bool:
        """The answer stopped at max_tokens (see ``incomplete`` for any cut)."""
        return self.finish_reason == "length"

    @property
    def incomplete(self) -> bool:
        """The answer may end before the model meant it to: stopped at max_tokens, or
        broken off (a stall, the step's deadline, a server gone). Such an answer is
        never taken as a final answer, cached or kept for a re-run as if whole."""
        return self.cut_off or self.cut_reason is not None
