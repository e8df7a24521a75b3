"""Provider prompt caching: marking a conversation's stable prefix, and reading back what
the cache served and saved.

Every root turn re-sends the whole conversation, so its input cost grows with the square
of the number of turns. Providers discount a repeated prefix: OpenAI and Gemini on
their own, Anthropic (also on Bedrock and Vertex) only up to ``cache_control``
breakpoints the request marks. Markers go only to those: other providers may reject
content blocks they do not know.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

from .profiles import PROFILES

_EPHEMERAL = {"type": "ephemeral"}
# Anthropic allows 4 breakpoints; the system prompt and the two newest user messages
# use 3: the newest writes the cache the next turn reads, the one before it is the read
# point should the newest not have been written.
_RECENT_MARKED = 2


def needs_markers(litellm: Any, model: str) -> bool:
    """True for providers whose prompt cache works only with explicit breakpoints."""
    profile = PROFILES.known_model(model)
    if profile is not None and profile.refuses_cache_markers:
        return False  # its provider rejected them: sent plain for the rest of the session
    return _provider_needs_markers(litellm, model)


@lru_cache(maxsize=64)
def _provider_needs_markers(litellm: Any, model: str) -> bool:
    try:
        _, provider, _, _ = litellm.get_llm_provider(model)
    except Exception:  # noqa: BLE001 - an unknown model gets no markers
        return False
    if provider == "anthropic":
        return True
    return (
        provider in ("bedrock", "bedrock_converse", "vertex_ai", "vertex_ai_beta")
        and "claude" in model.lower()
    )


def mark_prefix(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A copy of ``messages`` with ``cache_control`` breakpoints, in litellm's format
    (text content blocks), on the system prompt and the newest user messages."""
    marked = list(messages)
    users = [i for i, m in enumerate(marked) if m.get("role") == "user"]
    targets = set(users[-_RECENT_MARKED:])
    targets.update(i for i, m in enumerate(marked) if m.get("role") == "system")
    for index in targets:
        content = marked[index].get("content")
        if isinstance(content, str) and content:
            marked[index] = {
                **marked[index],
                "content": [{"type": "text", "text": content, "cache_control": _EPHEMERAL}],
            }
    return marked


def refuses_markers(exc: BaseException) -> bool:
    """A 400 that names the markers (or content blocks): the provider rejects them."""
    status = getattr(exc, "status_code", None)
    text = str(exc).lower()
    return status in (400, 422) and any(
        word in text for word in ("cache_control", "cache control", "must be a string")
    )


def cache_figures(usage: Any) -> tuple[int, int]:
    """(input tokens read from the provider's cache, input tokens written to it), from
    the fields litellm fills: ``prompt_tokens_details.cached_tokens`` (OpenAI, Gemini,
    and Anthropic's reads), ``cache_read_input_tokens`` and
    ``cache_creation_input_tokens`` (Anthropic)."""
    if usage is None:
        return 0, 0
    details = getattr(usage, "prompt_tokens_details", None)
    read = getattr(details, "cached_tokens", None) if details is not None else None
    if not read:
        read = getattr(usage, "cache_read_input_tokens", None)
    written = getattr(usage, "cache_creation_input_tokens", None)
    if not written and details is not None:
        written = getattr(details, "cache_creation_tokens", None)
    return int(read or 0), int(written or 0)
