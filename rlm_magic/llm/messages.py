"""Chat messages from what a user or model code passes: checked, with one-line errors
that name the helper that was called."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from ..errors import ConfigError

# A conversation, as every model call takes it: {"role": ..., "content": ...} dicts.
Messages = list[dict[str, Any]]


def build_messages(
    prompt: str, system: str | None, *, caller: str = "llm_query"
) -> list[dict[str, Any]]:
    if not isinstance(prompt, str):
        raise ConfigError(f"{caller} expects the prompt as a str, got {type(prompt).__name__}")
    if system is not None and not isinstance(system, str):
        raise ConfigError(f"{caller} expects system= as a str, got {type(system).__name__}")
    messages = [{"role": "system", "content": system}] if system else []
    messages.append({"role": "user", "content": prompt})
    return messages


def as_prompt_list(prompts: Any, caller: str) -> list[str]:
    """Accept any iterable of str (list, tuple, pandas Series, generator) but not a str,
    which would otherwise become one prompt per character."""
    if isinstance(prompts, (str, bytes)) or not isinstance(prompts, Iterable):
        raise ConfigError(
            f"{caller} expects a list of prompts, got {type(prompts).__name__}"
            + (
                f"; for one prompt use {caller.replace('_batch', '')}"
                if isinstance(prompts, str)
                else ""
            )
        )
    listed: list[str] = list(prompts)
    for index, prompt in enumerate(listed):
        if not isinstance(prompt, str):
            raise ConfigError(
                f"{caller}: prompt {index} is a {type(prompt).__name__}, expected str"
            )
    return listed


def check_max_tokens(max_tokens: int | None, caller: str) -> None:
    if max_tokens is not None and (not isinstance(max_tokens, int) or max_tokens < 1):
        raise ConfigError(f"{caller}: max_tokens must be a positive int, got {max_tokens!r}")
