"""Asking for a typed answer: whether a model takes a JSON schema (as litellm or its
server says), the request built either way, and the answer checked and asked again once
with the error when it does not match."""

from __future__ import annotations

import re
import warnings
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ...errors import InvalidAnswer, LLMQueryError
from .. import price_map
from ..litellm_loader import load_litellm
from ..profiles import PROFILES
from .answer_format import AnswerFormat
from .checks import Allowance, AnswerTooCostly, excerpt

if TYPE_CHECKING:
    from ..completion import Completion


def supports_schema(litellm: Any, model: str) -> bool:
    """Whether litellm says ``model`` takes a JSON schema. Asked once per model and size
    of litellm's price map: a model registered later (``litellm.register_model``) is
    asked again."""
    profile = PROFILES.model(model)
    size = len(litellm.model_cost)
    if profile.schema_support is None or profile.schema_support[0] != size:
        try:
            supported = bool(litellm.supports_response_schema(model=model))
        except Exception:  # noqa: BLE001 - a model litellm does not know
            supported = False
        profile.schema_support = (size, supported)
    return profile.schema_support[1]


@dataclass(frozen=True)
class Typed:
    """A validated answer and what it took: the completion that passed, plus the usage
    of a first attempt that did not."""

    value: Any
    completion: Completion
    extra_input_tokens: int = 0
    extra_output_tokens: int = 0
    extra_cost_usd: float = 0.0

    @property
    def text(self) -> str:
        return self.completion.text

    @property
    def model(self) -> str:
        return self.completion.model

    @property
    def input_tokens(self) -> int:
        return self.completion.input_tokens + self.extra_input_tokens

    @property
    def output_tokens(self) -> int:
        return self.completion.output_tokens + self.extra_output_tokens

    @property
    def cost_usd(self) -> float | None:
        cost = self.completion.cost_usd
        return None if cost is None else cost + self.extra_cost_usd

    @property
    def incomplete(self) -> bool:
        """The answer that passed may still have stopped at max_tokens (see
        ``Completion.incomplete``)."""
        return bool(self.completion.incomplete)


Complete = Callable[..., Awaitable[Any]]


def prepare(
    messages: list[dict[str, Any]],
    answer_format: AnswerFormat,
    litellm: Any,
    model: str,
    *,
    may_try: bool = False,
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The messages and ``response_format`` of a typed request to ``model``.
    ``may_try``: a model litellm does not know at an OpenAI-compatible server is sent
    the schema (and given it in the prompt too), for the caller falls back when the
    server refuses it (``ask``); a batch job cannot."""
    taken = takes_schema(litellm, model)
    structured = taken or (taken is None and may_try)
    if not structured:
        _tell_schema_not_sent(model, "litellm does not say that it takes one")
    if not taken:
        # JSON mode promises JSON, not this shape: the schema goes in the prompt.
        last = messages[-1]
        messages = [
            *messages[:-1],
            {**last, "content": f"{last['content']}\n\n{answer_format.instruction()}"},
        ]
    return messages, answer_format.request(bool(structured))


def takes_schema(litellm: Any, model: str) -> bool | None:
    """Whether ``model`` takes a JSON schema: as its server showed (the probe found
    llama.cpp or vLLM; or it refused one), else as litellm says; None for a model
    litellm does not know at an OpenAI-compatible server (it may: try)."""
    learned = PROFILES.model(model).server_takes_schema
    if learned is not None:
        return learned
    if litellm is not None:
        if supports_schema(litellm, model):
            return True
        known = any(name in litellm.model_cost for name in _names(model))
    else:  # not imported: its bundled price map says as much
        entry = price_map.entry(price_map.names_of(model))
        if entry is not None and entry.get("supports_response_schema"):
            return True
        known = entry is not None
    return None if not known and _SERVER_OF_THE_USERS.match(model) else False


# litellm's prefixes for an OpenAI-compatible server of the user's, which serves models
# litellm has no entry for (llama.cpp, vLLM, LM Studio, Ollama...).
_SERVER_OF_THE_USERS = re.compile(
    r"^(?:openai|hosted_vllm|ollama|ollama_chat|llamafile|lm_studio|custom_openai)/"
)


def _names(model: str) -> tuple[str, str]:
    return model, model.split("/", 1)[-1]


def refuses_schema(error: BaseException) -> bool:
    """Whether a failed call is the server refusing a ``json_schema`` response format
    (a 400 or 422 that names it)."""
    seen: BaseException | None = error
    for _ in range(6):  # the error and its causes
        if seen is None:
            return False
        status = getattr(seen, "status_code", None)
        if (status in (400, 422) or type(seen).__name__ == "UnsupportedParamsError") and (
            _NAMES_THE_FORMAT.search(str(seen))
        ):
            return True
        cause = getattr(seen, "cause", None)
        seen = cause if isinstance(cause, BaseException) else seen.__cause__
    return False


_NAMES_THE_FORMAT = re.compile(r"response_format|json_schema|schema", re.I)


def _tell_schema_not_sent(model: str, why: str) -> None:
    profile = PROFILES.model(model)
    if profile.told_schema_not_sent:
        return
    profile.told_schema_not_sent = True
    warnings.warn(
        f"typed answers from {model}: the JSON schema is not sent to the model ({why}); "
        "JSON mode is asked for with the schema in the prompt, which a small model may "
        "not follow (an answer that does not match is asked again once)",
        RuntimeWarning,
        stacklevel=3,
    )


async def _litellm_for(complete: Complete, model: str) -> Any:
    """litellm, or None when the call goes over the wire without it: a client's
    ``complete`` knows (``LLMClient.litellm_for``), and importing litellm first would
    keep the first request waiting for seconds."""
    litellm_for = getattr(getattr(complete, "__self__", None), "litellm_for", None)
    if litellm_for is None:
        return await load_litellm()
    return await litellm_for(model)


async def ask(
    complete: Complete,
    messages: list[dict[str, Any]],
    answer_format: AnswerFormat,
    model_name: str,
    **options: Any,
) -> Typed:
    """One typed call: ``complete(messages, response_format=..., **options)`` returns a
    completion; its text is validated, and asked for once more with the error if it
    does not pass. Raises ``LLMQueryError`` when the second answer fails too."""
    litellm = await _litellm_for(complete, model_name)
    asked = messages
    messages, response_format = prepare(messages, answer_format, litellm, model_name, may_try=True)
    try:
        first = await complete(messages, response_format=response_format, **options)
    except LLMQueryError as error:
        if response_format.get("type") != "json_schema" or not refuses_schema(error):
            raise
        # The server takes no schema: JSON mode from now on, and at once for this one.
        PROFILES.model(model_name).server_takes_schema = False
        _tell_schema_not_sent(model_name, f"its server refused it: {excerpt(str(error), 160)}")
        messages, response_format = prepare(asked, answer_format, litellm, model_name)
        first = await complete(messages, response_format=response_format, **options)
    allowance = Allowance()
    try:
        return Typed(await answer_format.checked(first.text, allowance), first)
    except AnswerTooCostly as problem:  # asking again would cost as much, and be paid
        raise LLMQueryError(model_name, f"the answer could not be checked: {problem}") from None
    except InvalidAnswer as problem:
        retry = [
            *messages,
            {"role": "assistant", "content": first.text},
            {
                "role": "user",
                "content": f"That answer is not valid ({problem}). {answer_format.instruction()}",
            },
        ]
    second = await complete(retry, response_format=response_format, **options)
    extra = dict(
        extra_input_tokens=first.input_tokens,
        extra_output_tokens=first.output_tokens,
        extra_cost_usd=first.cost_usd or 0.0,
    )
    try:
        return Typed(await answer_format.checked(second.text, allowance), second, **extra)
    except InvalidAnswer as problem:
        raise LLMQueryError(
            model_name, f"the answer did not match the schema twice ({problem})"
        ) from None
