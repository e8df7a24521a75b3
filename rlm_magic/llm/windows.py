"""How many tokens a model takes, and whether a prompt fits before it is sent.

A model's input window comes from litellm's model info, else ``RLM.context_window``,
else from the provider itself: its context-length error names the number, and it is
remembered for the rest of the session (per endpoint and model).

Counting is cheap on the loop: a character estimate decides clear cases; only a prompt
near the limit is counted exactly, in a thread when it is large.
"""

from __future__ import annotations

import asyncio
import re
from typing import Any

# What providers say when a prompt is over the window; the group is the window.
_WINDOW_IN_MESSAGE = [
    re.compile(r"maximum context length is ([\d,]+) tokens", re.I),  # OpenAI, vLLM
    re.compile(r"context size \(([\d,]+) tokens\)", re.I),  # llama.cpp
    re.compile(r"context (?:length|window|size)(?: limit)? (?:is|of) ([\d,]+)", re.I),
    re.compile(r"prompt is too long: \d+ tokens > ([\d,]+) maximum", re.I),  # Anthropic
]
_CONTEXT_WORDS = re.compile(r"context.(?:length|window|size)|prompt is too long|"
                            r"exceed_context_size|too many tokens", re.I)

# Windows providers told us about: (endpoint, model) -> tokens.
_LEARNED: dict[tuple[str | None, str], int] = {}
_MODEL_INFO: dict[str, int | None] = {}

CHARS_PER_TOKEN = 4  # the estimate; exact counts decide the close cases
_LARGE_CHARS = 50_000  # counted in a thread above this


def is_context_error(exc: BaseException | None) -> bool:
    """Whether ``exc`` (or what caused it) says the prompt was over the model's window."""
    for error in _chain(exc):
        if type(error).__name__ in ("ContextWindowExceededError", "PromptTooLongError"):
            return True
        status = getattr(error, "status_code", None)
        if status in (400, 413) and _CONTEXT_WORDS.search(str(error)):
            return True
    return False


def window_in_error(exc: BaseException | None) -> int | None:
    """The window a provider's context-length error names, if it names one."""
    for error in _chain(exc):
        for pattern in _WINDOW_IN_MESSAGE:
            match = pattern.search(str(error))
            if match:
                return int(match.group(1).replace(",", ""))
    return None


def learn_from(exc: BaseException, endpoint: str | None, model: str) -> int | None:
    """Remember the window a context-length error names; returns it."""
    if not is_context_error(exc):
        return None
    window = window_in_error(exc)
    if window:
        _LEARNED[(endpoint, model)] = window
    return window


def input_window(litellm: Any, model: str, endpoint: str | None,
                 configured: int | None, behind: list[str] = ()) -> int | None:
    """Tokens ``model`` takes as input: litellm's model info, else ``configured``
    (``RLM.context_window``), else what the provider said in an error; None if unknown.
    ``behind``: the models behind a Router group (the smallest window counts)."""
    known = _model_info_window(litellm, model)
    if not known and behind:
        windows = [_model_info_window(litellm, name) for name in behind]
        known = min(windows) if windows and all(windows) else None
    window = known or configured or None
    learned = _LEARNED.get((endpoint, model))
    # What the server said wins when it is smaller: a local server may run a model with
    # a shorter context than litellm's entry (Ollama's num_ctx), and asking again with
    # the same room would be refused again.
    return min(window, learned) if window and learned else window or learned


def missing_model_info(models) -> list[str]:
    """The models whose info litellm has not been asked for yet."""
    return [model for model in models if model not in _MODEL_INFO]


def look_up(litellm: Any, models) -> None:
    """Ask litellm for each model's info (in a thread: for some providers, Ollama and
    Hugging Face among them, litellm asks the server over HTTP)."""
    for model in models:
        _model_info_window(litellm, model)


def _model_info_window(litellm: Any, model: str) -> int | None:
    if litellm is None:
        return None  # not loaded yet: nothing to ask
    if model not in _MODEL_INFO:
        try:
            info = litellm.get_model_info(model)
            window = info.get("max_input_tokens") or info.get("max_tokens")
        except Exception:  # noqa: BLE001 - litellm raises for models it has no entry for
            window = None
        _MODEL_INFO[model] = int(window) if window else None
    return _MODEL_INFO[model]


def reserve_for_answer(window: int, max_tokens: int) -> int:
    """Tokens kept free for the answer: ``max_tokens``, but at most half the window (a
    4k-token local model with the default max_tokens of 4096 still takes prompts)."""
    return min(max_tokens, window // 2)


def estimate_tokens(messages: list[dict]) -> int:
    """Tokens of a conversation by its characters: cheap, about right for prose."""
    return _characters(messages) // CHARS_PER_TOKEN + 4 * len(messages)


async def prompt_tokens_over(litellm: Any, model: str, messages: list[dict],
                             room: int) -> int | None:
    """The prompt's tokens when they are over ``room``, else None.

    Clear cases are decided by the estimate; a prompt near the limit is counted
    exactly, off the loop when it is large."""
    estimate = estimate_tokens(messages)
    if estimate <= room // 2:
        return None
    characters = _characters(messages)
    if characters // 8 > room:  # over even at 8 characters a token
        return estimate
    try:
        if characters > _LARGE_CHARS:
            exact = await asyncio.to_thread(_count, litellm, model, messages)
        else:
            exact = _count(litellm, model, messages)
    except Exception:  # noqa: BLE001 - no tokenizer: trust the estimate
        exact = estimate
    return exact if exact > room else None


def _count(litellm: Any, model: str, messages: list[dict]) -> int:
    return int(litellm.token_counter(model=model, messages=messages))


def _characters(messages: list[dict]) -> int:
    return sum(len(m["content"]) for m in messages if isinstance(m.get("content"), str))


def _chain(exc: BaseException | None):
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        yield exc
        cause = getattr(exc, "cause", None)
        exc = cause if isinstance(cause, BaseException) else exc.__cause__
