"""The most input tokens a provider may bill for a request: what a cost budget holds
a call's input at (``budget``).

Its input is its messages and whatever else the request carries that is billed as input
(tools, functions, a response_format: ``RLM.litellm_kwargs`` included), as JSON. A
prompt up to ``SMALL_PROMPT`` characters counts as its UTF-8 bytes (no byte-level
tokenizer makes more tokens than bytes); a larger one by litellm's tokenizer (the larger
of that and the estimate), 5% over, and each digit a token where the model's tokenizer
may read it so. Without litellm (not imported: the wire transport), its bytes.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable
from types import ModuleType

from .messages import Messages
from .windows import estimate_tokens

SMALL_PROMPT = 2_000  # characters: counted as bytes up to this, by a tokenizer past it
COUNT_MARGIN = 1.05  # over litellm's count: another tokenizer may read a few % more
_OFF_LOOP = 50_000  # characters: a prompt this long is counted in a thread (~15 ms / 400k)
_MESSAGE_OVERHEAD = 8  # tokens a chat template may add per message


async def input_tokens_at_most(
    litellm: ModuleType | None, model: str, messages: Messages, extra: str = ""
) -> int:
    """The most input tokens a provider may bill for ``messages`` and ``extra`` (see the
    module's docstring); a large prompt is counted off the loop. ``litellm`` None (not
    imported): its bytes."""
    if extra:
        messages = [*messages, {"role": "system", "content": extra}]
    texts = _texts(messages)
    overhead = _MESSAGE_OVERHEAD * len(messages)
    characters = sum(map(len, texts))
    if characters <= SMALL_PROMPT or litellm is None:
        return sum(len(text.encode("utf-8")) for text in texts) + overhead
    key = (model, hash(tuple(texts)), characters)
    counted = _COUNTED.get(key)
    if counted is None:
        try:
            # Off the loop when long, and the first time (the tokenizer loads: ~0.4 s).
            if characters > _OFF_LOOP or not _COUNTED:
                counted = await asyncio.to_thread(_count, litellm, model, messages)
            else:
                counted = _count(litellm, model, messages)
        except Exception:  # noqa: BLE001 - no tokenizer: the bytes bound
            counted = sum(len(text.encode("utf-8")) for text in texts)
        if len(_COUNTED) > 1024:
            _COUNTED.clear()
        _COUNTED[key] = counted
    return int(max(counted, estimate_tokens(messages, model)) * COUNT_MARGIN) + overhead


def _texts(messages: Messages) -> list[str]:
    return [
        m["content"] if isinstance(m.get("content"), str) else str(m.get("content"))
        for m in messages
    ]


def characters(messages: Messages, extra: str) -> int:
    return sum(map(len, _texts(messages))) + len(extra)


# Counts of large prompts, by (model, the texts' hash, their length): a map's holds and
# then its calls count each prompt once.
_COUNTED: dict[tuple[str, int, int], int] = {}


def answer_counter(litellm: ModuleType | None, model: str) -> Callable[[str], int] | None:
    """What counts an answer's text as litellm will (None: litellm is not imported)."""
    token_counter = getattr(litellm, "token_counter", None)
    if token_counter is None:
        return None
    return lambda text: token_counter(model=model, text=text)


def _count(litellm: ModuleType, model: str, messages: Messages) -> int:
    counted = int(litellm.token_counter(model=model, messages=messages))
    if _THREE_DIGITS_A_TOKEN.match(model):
        return counted
    # litellm counts by OpenAI's tokenizer when it has no other, which reads up to three
    # digits a token; Gemini's, Qwen's, Llama 2's and Mistral's read one: a table of
    # numbers was billed 1.7x the hold. Each digit may be a token of its own.
    digits = sum(
        len(text) - len(text.translate(_NO_DIGITS))
        for text in (m.get("content") for m in messages)
        if isinstance(text, str)
    )
    return counted + (2 * digits + 2) // 3


_NO_DIGITS = str.maketrans("", "", "0123456789")
# Models whose tokenizer reads numbers three digits a token, as litellm counts them:
# OpenAI's (litellm's count is theirs) and Llama 3's.
_THREE_DIGITS_A_TOKEN = re.compile(r"^(?:.*/)?(?:gpt-|o\d|chatgpt-|(?:meta-)?llama-?3)", re.I)
