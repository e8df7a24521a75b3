"""A root model's conversation long enough to be compacted, as the specifications of
windows and of cut answers start from it."""

from __future__ import annotations

from rlm_magic.rlm.compaction import Conversation

from .rlms import ROOT

PROSE = "The quick brown fox jumps over the lazy dog near the river bank. "  # ~4 chars/token


def long_conversation(rlm) -> Conversation:
    async def share(history):
        pass

    conversation = Conversation(
        rlm.client,
        model=ROOT,
        max_tokens=100,
        compact_at=0.8,
        ledger=rlm.client.ledger,
        deadline=None,
        share_history=share,
        status=lambda _: None,
        compactions=[],
    )
    conversation.start("system", "question")
    conversation.add(PROSE * 20, PROSE * 20)  # ~500 tokens for the summary to replace
    return conversation
