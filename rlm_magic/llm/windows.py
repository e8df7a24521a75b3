"""How many tokens a model takes, and whether a prompt fits before it is sent.

A model's input window comes from the server itself when it says (a local server's
own endpoint, see ``local_servers``), else litellm's model info, else
``RLM.context_window``; a provider's context-length error names the number too, and it
is remembered for the rest of the session (per endpoint and model).

Counting is cheap on the loop: a character estimate decides clear cases; only a prompt
near the limit is counted exactly: by the server's own tokenizer where it has one (a
local llama.cpp's or vLLM's ``/tokenize``), else by litellm's if it is imported (in a
thread when the prompt is large). litellm is never imported to count: that held the
first request 5 s on a 4,096-token server at the default ``max_tokens``, where every
prompt is near the window. Without either, ``cautious_estimate`` counts.

The estimate's characters per token are learned per model from its own usage reports
(and from the counts its refusals name), and before a run's first turn from its
server's own count of a sample of the context where the server has a ``/tokenize``
(llama.cpp, vLLM): Gemma reads log text at 1.75, not 4.

Room for the answer is what answers need, not ``max_tokens`` whatever the prompt: a
prompt is refused only when not even a short answer would fit beside it, and when it
fits with less than ``max_tokens``, ``max_tokens`` is lowered to what fits (a server
would refuse, or cut, the request as asked).

Why one module: the window, the characters a token reads and the room left for the
answer are one estimate, made from the same learned facts; a prompt fitted by one rule
and its answer by another would be refused by the server that both were meant to fit.
"""

from __future__ import annotations

import asyncio
import re
import string
from collections.abc import Awaitable, Callable, Iterable, Iterator, Sequence
from typing import Any

from ..errors import PromptTooLongError
from . import price_map
from .local_servers import count_tokens, guessed_window, local_server_kind, reported_window
from .profiles import DEFAULT_CHARS_PER_TOKEN, PROFILES

# What providers say when a prompt is over the window; the group is the window.
_WINDOW_IN_MESSAGE = [
    re.compile(r"maximum context length is ([\d,]+) tokens", re.I),  # OpenAI, vLLM
    re.compile(r"context size \(([\d,]+) tokens\)", re.I),  # llama.cpp
    re.compile(r"context (?:length|window|size)(?: limit)? (?:is|of) ([\d,]+)", re.I),
    re.compile(r"prompt is too long: \d+ tokens > ([\d,]+) maximum", re.I),  # Anthropic
]
_CONTEXT_WORDS = re.compile(
    r"context.(?:length|window|size)|prompt is too long|"
    r"exceed_context_size|too many tokens",
    re.I,
)

# What providers say about the prompt's own size in such an error.
_PROMPT_IN_MESSAGE = [
    re.compile(r"request \(([\d,]+) tokens\) exceeds", re.I),  # llama.cpp
    re.compile(r"\(([\d,]+) in the messages", re.I),  # vLLM, OpenAI (with max_tokens)
    re.compile(r"your messages resulted in ([\d,]+) tokens", re.I),  # OpenAI
    re.compile(r"prompt is too long: ([\d,]+) tokens", re.I),  # Anthropic
]

MIN_ANSWER = 256  # a prompt is refused only when not even this much answer fits
_LARGE_CHARS = 50_000  # counted in a thread above this
_MESSAGE_OVERHEAD = 4  # tokens a chat template adds per message
# A server's count of a prompt's text (``local_servers.count_tokens``); None: it cannot say.
ServerCount = Callable[[str], Awaitable[int | None]]
# Characters: the token ids /tokenize answers a longer prompt with (~7 bytes each) would
# pass what is read of an answer (``local_servers.MAX_BODY``).
_SERVER_COUNTS_AT_MOST = 400_000


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
    return _number_in_error(exc, _WINDOW_IN_MESSAGE)


def prompt_in_error(exc: BaseException | None) -> int | None:
    """The prompt's tokens as a provider's context-length error counts them."""
    return _number_in_error(exc, _PROMPT_IN_MESSAGE)


def _number_in_error(exc: BaseException | None, patterns: Iterable[re.Pattern[str]]) -> int | None:
    """The first number one of ``patterns`` finds in the error or its causes."""
    for error in _chain(exc):
        for pattern in patterns:
            match = pattern.search(str(error))
            if match:
                return int(match.group(1).replace(",", ""))
    return None


def learn_from(
    exc: BaseException,
    endpoint: str | None,
    model: str,
    messages: list[dict[str, Any]] | None = None,
) -> int | None:
    """Remember the window a context-length error names, and the characters per token
    its count of the prompt shows (``messages``: the prompt refused); returns the
    window."""
    if not is_context_error(exc):
        return None
    window = window_in_error(exc)
    if window:
        PROFILES.at(endpoint, model).window_from_error = window
    counted = prompt_in_error(exc)
    if counted and messages:
        # The server's own tokenizer on this very text: it outweighs what was learned.
        profile = PROFILES.model(model)
        profile.characters_read = profile.tokens_counted = 0.0
        learn_usage(model, messages, counted)
    return window


def learn_usage(
    model: str,
    messages: list[dict[str, Any]],
    input_tokens: int,
    output_tokens: int = 0,
    finished: bool = False,
) -> None:
    """Learn from a call's usage report: the model's characters per token (prompts
    large enough to say), and how long its finished answers run."""
    profile = PROFILES.model(model)
    if finished and output_tokens > 0:
        profile.longest_answer = max(profile.longest_answer, output_tokens)
    tokens = input_tokens - _MESSAGE_OVERHEAD * len(messages)
    characters = _characters(messages)
    if tokens < 100 or characters < 400:
        return  # too small to tell the tokenizer from the template around it
    ratio = characters / tokens
    if not 0.8 <= ratio <= 12:
        return  # a usage figure that is not this prompt's count (a fixed or cached one)
    if profile.tokens_counted > 200_000:  # recent prompts weigh most
        profile.characters_read /= 2
        profile.tokens_counted /= 2
    profile.characters_read += characters
    profile.tokens_counted += tokens


async def learn_tokenizers(
    api_base: str, models: Iterable[str], sample: str, api_key: str | None = None
) -> None:
    """Each model's characters per token, from its server's count of ``sample`` (the
    servers that have a ``/tokenize``: llama.cpp, vLLM; all at once, each within the
    probe's time)."""
    asked = [
        m for m in sorted(set(models)) if local_server_kind(api_base, m) in ("llama.cpp", "vllm")
    ]
    if not asked:
        return
    counts = await asyncio.gather(*(count_tokens(api_base, m, sample, api_key) for m in asked))
    for model, tokens in zip(asked, counts):
        if tokens:
            learn_tokenizer(model, len(sample), tokens)


def learn_tokenizer(model: str, characters: int, tokens: int) -> bool:
    """Learn ``model``'s characters per token from its server's own count of a sample
    of the text it will read (``local_servers.count_tokens``): that outweighs what its
    usage reports taught (other text, a chat template around it). False when the sample
    is too small to say."""
    if tokens < 50 or characters < 200 or not 0.8 <= characters / tokens <= 12:
        return False
    profile = PROFILES.model(model)
    weight = max(tokens, 100)  # (enough to count as learned: ``learned_ratio``)
    profile.characters_read = characters * weight / tokens
    profile.tokens_counted = float(weight)
    return True


def chars_per_token(model: str | None = None) -> float:
    """Characters per token of ``model`` as its usage reports showed, else the default."""
    profile = PROFILES.known_model(model)
    if profile is None or profile.tokens_counted < 100:
        return DEFAULT_CHARS_PER_TOKEN
    return min(12.0, max(0.8, profile.characters_read / profile.tokens_counted))


def learned_ratio(model: str | None) -> bool:
    profile = PROFILES.known_model(model)
    return profile is not None and profile.tokens_counted >= 100


def input_window(
    litellm: Any,
    model: str,
    endpoint: str | None,
    configured: int | None,
    behind: Sequence[str] = (),
    advice: bool = False,
) -> int | None:
    """Tokens ``model`` takes as input: ``configured`` (``RLM.context_window``: the
    user knows their setup), else what its server reported, else litellm's model info,
    else what the provider said in an error; None if unknown. ``behind``: the models
    behind a Router group (the smallest window counts). ``advice``: for planning only
    (chunk sizes, when to compact), a guessed window (Ollama's default) counts too; a
    prompt is never refused on a guess."""
    known = reported_window(endpoint, model) or _model_info_window(litellm, model)
    if not known and behind:
        found = [_model_info_window(litellm, name) for name in behind]
        sizes = [size for size in found if size]
        known = min(sizes) if sizes and len(sizes) == len(found) else None
    window = configured or known or None
    if window is None and advice:
        window = guessed_window(endpoint, model)
    at = PROFILES.known_at(endpoint, model)
    learned = at.window_from_error if at is not None else None
    # What the server said wins when it is smaller: a local server may run a model with
    # a shorter context than litellm's entry (Ollama's num_ctx), and asking again with
    # the same room would be refused again.
    return min(window, learned) if window and learned else window or learned


def missing_model_info(models: Iterable[str]) -> list[str]:
    """The models whose info litellm has not been asked for yet."""
    return [model for model in models if not _model_info_asked(model)]


def _model_info_asked(model: str) -> bool:
    profile = PROFILES.known_model(model)
    return profile is not None and profile.model_info_asked


def look_up(litellm: Any, models: Iterable[str]) -> None:
    """Ask litellm for each model's info (in a thread: for some providers, Ollama and
    Hugging Face among them, litellm asks the server over HTTP)."""
    for model in models:
        _model_info_window(litellm, model)


def look_up_in_price_map(models: Iterable[str]) -> None:
    """Each model's window from litellm's price map, litellm not imported (a model the
    wire transport serves: its entry as ``litellm.get_model_info`` would read it)."""
    for model in models:
        profile = PROFILES.model(model)
        if not profile.model_info_asked:
            info = price_map.entry(price_map.names_of(model)) or {}
            window = info.get("max_input_tokens") or info.get("max_tokens")
            profile.model_info_window = int(window) if isinstance(window, (int, float)) else None
            profile.model_info_asked = True


def _model_info_window(litellm: Any, model: str) -> int | None:
    known = PROFILES.known_model(model)
    if known is not None and known.model_info_asked:
        return known.model_info_window  # (asked of litellm, or of its price map)
    if litellm is None:
        return None  # not loaded yet: nothing to ask
    profile = PROFILES.model(model)
    if not profile.model_info_asked:
        try:
            info = litellm.get_model_info(model)
            window = info.get("max_input_tokens") or info.get("max_tokens")
        except Exception:  # noqa: BLE001 - litellm raises for models it has no entry for
            window = None
        profile.model_info_window = int(window) if window else None
        profile.model_info_asked = True
    return profile.model_info_window


def answer_room(window: int, max_tokens: int, model: str | None = None) -> int:
    """Tokens to plan for an answer of ``model`` (chunk advice, when to compact): what
    its longest finished answer took, with a margin, else a quarter of the window;
    never more than ``max_tokens``, never less than the shortest answer."""
    profile = PROFILES.known_model(model)
    longest = profile.longest_answer if profile is not None else None
    need = int(longest * 1.25) + 16 if longest else window // 4
    return max(shortest_answer(max_tokens), min(max_tokens, need, window // 2))


def shortest_answer(max_tokens: int) -> int:
    """The least room for an answer that a prompt must leave to be sent."""
    return min(max_tokens, MIN_ANSWER)


def estimate_tokens(messages: list[dict[str, Any]], model: str | None = None) -> int:
    """Tokens of a conversation by its characters: cheap, and as right as the model's
    learned characters per token (4 until its usage says)."""
    return int(_characters(messages) / chars_per_token(model)) + _MESSAGE_OVERHEAD * len(messages)


def cautious_estimate(messages: list[dict[str, Any]], model: str | None = None) -> int:
    """Tokens of a conversation where no tokenizer counts them: ``estimate_tokens`` once
    the model's characters per token are learned (they tell how it reads such text),
    else ``dense_tokens``."""
    if learned_ratio(model):
        return estimate_tokens(messages, model)
    texts = [m["content"] for m in messages if isinstance(m.get("content"), str)]
    return sum(dense_tokens(text, model) for text in texts) + _MESSAGE_OVERHEAD * len(messages)


def dense_tokens(text: str, model: str | None = None) -> int:
    """Tokens of ``text`` counted so as not to fall short of a tokenizer's: a digit or a
    non-ASCII character a token each (Llama's and Gemma's read digits one a token; CJK
    is about one a character), ASCII punctuation half a token (JSON and code are dense
    in it), the rest at the model's characters per token. Against OpenAI's cl100k it
    reads prose, code, logs and JSON at 1.0-1.2x, where ``estimate_tokens`` reads logs
    and JSON at half. Linear, at C speed: it runs on the loop."""
    ascii_only = text.encode("ascii", "ignore")
    digits = len(ascii_only) - len(ascii_only.translate(None, _DIGITS))
    punctuation = len(ascii_only) - len(ascii_only.translate(None, _PUNCTUATION))
    rest = len(ascii_only) - digits - punctuation
    dense = digits + punctuation / 2 + (len(text) - len(ascii_only))
    return int(rest / chars_per_token(model) + dense)


_DIGITS = string.digits.encode()
_PUNCTUATION = string.punctuation.encode()


async def fit_answer(
    litellm: Any,
    model: str,
    messages: list[dict[str, Any]],
    window: int,
    max_tokens: int,
    server_count: ServerCount | None = None,
) -> int:
    """``max_tokens`` to send with this prompt: as asked when prompt and answer fit
    the window, less when only a shorter answer fits (a server would refuse the
    request as asked, or cut it). Raises ``PromptTooLongError`` when not even the
    shortest answer fits: then the prompt must be cut. ``litellm``: None when it is not
    imported (it is not imported here); ``server_count``: the server's own tokenizer."""
    shortest = shortest_answer(max_tokens)
    room = max(0, window - max_tokens)
    tokens = await prompt_tokens_over(litellm, model, messages, room, server_count)
    if tokens is None:
        return max_tokens
    if tokens > window - shortest:
        raise PromptTooLongError(
            model,
            tokens,
            window - shortest,
            window=window,
            max_tokens=max_tokens,
            chars_per_token=chars_per_token(model),
        )
    # An estimate may be short by a few percent: leave that much of the window free.
    margin = 0 if tokens <= 0 else max(8, tokens // 20)
    return max(shortest, min(max_tokens, window - tokens - margin))


async def prompt_tokens_over(
    litellm: Any,
    model: str,
    messages: list[dict[str, Any]],
    room: int,
    server_count: ServerCount | None = None,
) -> int | None:
    """The prompt's tokens when they are over ``room``, else None.

    Clear cases are decided by the estimate; a prompt near the limit is counted: by
    ``server_count`` (the model's own tokenizer) when it answers, else by litellm when
    it is imported (``litellm``; off the loop when the prompt is large), else by
    ``cautious_estimate``."""
    estimate = estimate_tokens(messages, model)
    if estimate <= room // 2:
        return None
    characters = _characters(messages)
    if 0 < room < characters // 8 and not learned_ratio(model):  # over even at 8 a token
        return estimate
    counted = None
    if server_count is not None and characters <= _SERVER_COUNTS_AT_MOST:
        text = "\n".join(m["content"] for m in messages if isinstance(m.get("content"), str))
        by_server = await server_count(text)
        if by_server is not None:
            counted = by_server + _MESSAGE_OVERHEAD * len(messages)
    if counted is None and litellm is not None:
        counted = await _litellm_count(litellm, model, messages, estimate)
    if counted is None:  # (litellm not imported: the wire path goes on without it)
        counted = cautious_estimate(messages, model)
    return counted if counted > room else None


async def _litellm_count(
    litellm: Any, model: str, messages: list[dict[str, Any]], estimate: int
) -> int:
    """litellm's count of the prompt, or the estimate where that may be larger."""
    try:
        if _characters(messages) > _LARGE_CHARS:
            exact = await asyncio.to_thread(_count, litellm, model, messages)
        else:
            exact = _count(litellm, model, messages)
    except Exception:  # noqa: BLE001 - no tokenizer: trust the estimate
        exact = estimate
    profile = PROFILES.known_model(model)
    if learned_ratio(model) or profile is None or not profile.model_info_window:
        # litellm counts a model it has no entry for with OpenAI's tokenizer, which
        # may read its text quite differently: the estimate stands when larger.
        exact = max(exact, estimate)
    return exact


def _count(litellm: Any, model: str, messages: list[dict[str, Any]]) -> int:
    return int(litellm.token_counter(model=model, messages=messages))


def _characters(messages: list[dict[str, Any]]) -> int:
    return sum(len(m["content"]) for m in messages if isinstance(m.get("content"), str))


def _chain(exc: BaseException | None) -> Iterator[BaseException]:
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        yield exc
        cause = getattr(exc, "cause", None)
        exc = cause if isinstance(cause, BaseException) else exc.__cause__
