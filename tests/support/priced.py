"""A priced sub-model and the budgets sized to it, as the budget specifications use them.

The sub-model is ``openai/gpt-4o`` ($2.50 a million input tokens, $10 output), served by
the local server, which counts a prompt at ~4 characters a token. A prompt of
``PROMPT_CHARS`` characters is held at its bytes plus a little (it is that short), and
``MAX_TOKENS`` of answer at $10 a million: each call holds ``MOST`` (~$0.0125) while it
runs and really costs ~$0.003."""

from __future__ import annotations

from .rlms import make_rlm

PRICED = "openai/gpt-4o"
MAX_TOKENS = 1000
PROMPT_CHARS = 1000
# The most one call of a PROMPT_CHARS prompt can cost: its UTF-8 bytes and the chat
# template's allowance (16 tokens for two messages at most), and MAX_TOKENS of answer.
MOST = (PROMPT_CHARS + 16) * 2.5e-6 + MAX_TOKENS * 1e-5


def prompts(count: int) -> list[str]:
    return [f"{i:04d} " + "word " * ((PROMPT_CHARS - 5) // 5) for i in range(count)]


def room_for(calls: int) -> float:
    """A budget with room for ``calls`` calls at their most, and not one more."""
    return round(MOST * (calls + 0.5), 6)


def priced_rlm(server, **settings):
    server.usage = None  # counted as it would be billed: ~4 characters a token
    return make_rlm(server, sub_model=PRICED, max_tokens=MAX_TOKENS, **settings)
