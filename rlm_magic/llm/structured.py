"""Typed answers: ``response_format=`` turns a model's answer into a validated object.

The format is a pydantic model (notebook side: answers are instances of it) or a JSON
schema (both sides; answers are dicts, what the sandbox can receive). The request uses
the provider's structured-output mode where litellm says the model supports it
(``litellm.supports_response_schema``), and JSON mode with the schema in the prompt
elsewhere. Every answer is checked here either way: one that does not validate is asked
again once, with the error; a second failure is that item's error, like any failed call.
"""

from __future__ import annotations

import json
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NoReturn

from ..errors import ConfigError, InvalidAnswer, LLMQueryError
from .litellm_loader import load_litellm
from .profiles import PROFILES

if TYPE_CHECKING:
    from .completion import Completion

_FENCE = re.compile(r"^\s*```(?:json)?\s*\n(.*?)\n\s*```\s*$", re.DOTALL)


class AnswerFormat:
    """What a typed answer must look like, built once per call or batch.

    ``trusted=False`` is for a schema written by model code (the REPL's helpers): it may
    not hold regular expressions (``pattern``), which the kernel would run against the
    answer on its loop, where a catastrophic one stalls it for minutes. No schema may
    refer outside itself: a remote ``$ref`` would have the kernel fetch a URL (the
    sandbox has no network; the kernel must not become its proxy).
    """

    def __init__(self, spec: Any, *, trusted: bool = True):
        self.model: Any = None  # a pydantic model class, or None for a JSON schema
        self._check: Any = None  # the schema's validator, or None for a pydantic model
        if isinstance(spec, type) and hasattr(spec, "model_validate_json"):
            self.model = spec  # a pydantic model class
            self.schema = self.model.model_json_schema()
            self.name = spec.__name__
            self._check = None
        elif isinstance(spec, dict):
            schema = spec
            if spec.get("type") == "json_schema" and isinstance(spec.get("json_schema"), dict):
                schema = spec["json_schema"].get("schema") or {}  # OpenAI's own wrapping
            import jsonschema
            import referencing

            try:
                validator_class = jsonschema.validators.validator_for(schema)
                validator_class.check_schema(schema)
            except jsonschema.SchemaError as exc:
                raise ConfigError(
                    f"response_format is not a valid JSON schema: {exc.message}"
                ) from None
            _refuse_outside_references(schema, trusted)
            self.schema = schema
            self.name = _name(schema.get("title", "answer"))
            # A registry that retrieves nothing: jsonschema would otherwise fetch a
            # remote $ref itself (with urlopen, on the loop, no timeout).
            self._check = validator_class(
                schema, registry=referencing.Registry(retrieve=_retrieve_nothing)
            )
        else:
            raise ConfigError(
                "response_format must be a pydantic model class or a JSON "
                f"schema (a dict), got {type(spec).__name__}"
            )
        self._schema_text = json.dumps(self.schema, separators=(",", ":"))

    def identity(self) -> str:
        """What distinguishes this format in a cache or resume key."""
        return self._schema_text

    def request(self, structured: bool) -> dict[str, Any]:
        """The ``response_format`` to send: the schema itself where the provider takes
        one, plain JSON mode elsewhere (the schema then goes in the prompt)."""
        if structured:
            return {
                "type": "json_schema",
                "json_schema": {"name": self.name, "schema": self.schema},
            }
        return {"type": "json_object"}

    def instruction(self) -> str:
        return f"Answer with JSON only, matching this JSON schema: {self._schema_text}"

    def parse(self, text: str) -> Any:
        """The answer as an object (a pydantic instance or a dict), or InvalidAnswer."""
        fenced = _FENCE.match(text)
        if fenced:  # JSON mode on some models still wraps the object in a code fence
            text = fenced.group(1)
        if self.model is not None:
            from pydantic import ValidationError

            try:
                return self.model.model_validate_json(text)
            except ValidationError as exc:
                first = exc.errors()[0]
                where = ".".join(str(p) for p in first.get("loc", ())) or "the answer"
                raise InvalidAnswer(f"{where}: {first.get('msg')}") from None
        try:
            value = json.loads(text)
        except ValueError as exc:
            raise InvalidAnswer(f"not JSON ({exc})") from None
        error = next(iter(self._check.iter_errors(value)), None)
        if error is not None:
            where = ".".join(str(p) for p in error.absolute_path) or "the answer"
            raise InvalidAnswer(f"{where}: {error.message}")
        return value


# Keywords whose value maps names to schemas: there the keys are names, not keywords.
_NAMED_SCHEMAS = frozenset(
    {"properties", "patternProperties", "$defs", "definitions", "dependentSchemas"}
)
# Keywords whose value is data, not schema (a "$ref" key inside is no reference).
_DATA = frozenset({"enum", "const", "default", "examples"})


def _refuse_outside_references(schema: Any, trusted: bool) -> None:
    """One-line errors for what a schema may not hold (see ``AnswerFormat``)."""
    stack = [schema]
    while stack:
        node = stack.pop()
        if isinstance(node, list):
            stack.extend(node)
            continue
        if not isinstance(node, dict):
            continue
        for key, value in node.items():
            if key in ("$ref", "$dynamicRef") and not (
                isinstance(value, str) and value.startswith("#")
            ):
                raise ConfigError(
                    f"response_format may refer only to its own "
                    f"definitions ('#/...'), not to {str(value)[:80]!r}"
                )
            if key == "$id" and isinstance(value, str) and ":" in value:
                raise ConfigError("response_format may not name a URI as its $id")
            if not trusted and key in ("pattern", "patternProperties"):
                raise ConfigError(
                    "response_format from model code may not hold regular "
                    "expressions (pattern, patternProperties)"
                )
            if key in _NAMED_SCHEMAS and isinstance(value, dict):
                stack.extend(value.values())
            elif key not in _DATA:
                stack.append(value)


def _retrieve_nothing(uri: str) -> NoReturn:
    from referencing.exceptions import NoSuchResource

    raise NoSuchResource(ref=uri)


def _name(title: str) -> str:
    # OpenAI takes names of letters, digits, '_' and '-', up to 64 characters.
    return re.sub(r"[^A-Za-z0-9_-]", "_", str(title))[:64] or "answer"


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
    messages: list[dict[str, Any]], answer_format: AnswerFormat, litellm: Any, model: str
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The messages and ``response_format`` of a typed request to ``model``."""
    structured = supports_schema(litellm, model)
    if not structured:
        # JSON mode promises JSON, not this shape: the schema goes in the prompt.
        last = messages[-1]
        messages = [
            *messages[:-1],
            {**last, "content": f"{last['content']}\n\n{answer_format.instruction()}"},
        ]
    return messages, answer_format.request(structured)


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
    litellm = await load_litellm()
    messages, response_format = prepare(messages, answer_format, litellm, model_name)
    first = await complete(messages, response_format=response_format, **options)
    try:
        return Typed(answer_format.parse(first.text), first)
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
        return Typed(answer_format.parse(second.text), second, **extra)
    except InvalidAnswer as problem:
        raise LLMQueryError(
            model_name, f"the answer did not match the schema twice ({problem})"
        ) from None
