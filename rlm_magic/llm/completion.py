"""``Completion``: a model's answer as every caller of the client receives it."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Completion:
    """A model's answer and what it cost."""

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
    # server gone): ``text`` is what had arrived, with "[answer cut off: why]" after it.
    cut_reason: str | None = None

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
