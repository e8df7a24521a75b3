"""``AnswerFormat``: what a typed answer must look like (a pydantic model or a JSON
schema), and its answers parsed and checked against it (within ``checks``' bounds for a
schema from model code)."""

from __future__ import annotations

import asyncio
import json
import re
import threading
import time
from collections import OrderedDict
from typing import Any

from ...errors import ConfigError, InvalidAnswer
from .checks import (
    PARSED_ON_LOOP,
    Allowance,
    CheckBudget,
    abandonable,
    checking,
    counted,
    excerpt,
    refuse_outside_references,
    refuse_oversize,
    retrieve_nothing,
    unfenced,
    unwrapped,
    within_budget,
)

_BUILT: OrderedDict[str, AnswerFormat] = OrderedDict()  # model code's formats, by schema


class AnswerFormat:
    """What a typed answer must look like, built once per call or batch.

    ``trusted=False`` is for a schema written by model code (the REPL's helpers, built by
    ``from_model_code``). Everything the kernel does with it is bounded, since model
    code can make a small schema cost exponential time (``$ref``s that double per level)
    or a large one cost seconds to check: it holds at most ``MAX_SCHEMA_VALUES`` values,
    ``MAX_EXPANDED_NODES`` once its references are followed, none of them circular, and
    no regular expression (``pattern``: the kernel would run it against the answer,
    where a catastrophic one stalls for minutes) nor ``unevaluated*`` keyword (each
    application walks the schema again for every property); checking it and its answers
    runs off the loop, each answer within ``MAX_CHECKS`` units of work counted at their
    real cost (see ``CheckBudget``) and ``MAX_CHECK_SECONDS`` of the thread's time. No schema
    may refer outside itself: a remote ``$ref`` would have the kernel fetch a URL (the
    sandbox has no network; the kernel must not become its proxy).

    Any answer, whoever wrote the schema, is at most ``MAX_ANSWER_CHARS`` characters and
    ``MAX_ANSWER_VALUES`` JSON values, both counted before it is decoded; a large one is
    checked off the loop, and a check off the loop stops at its next step once the call
    waiting for it is cancelled (its step ended).
    """

    def __init__(self, spec: Any, *, trusted: bool = True):
        self.model: Any = None  # a pydantic model class, or None for a JSON schema
        self._check: Any = None  # the schema's validator, or None for a pydantic model
        self.trusted = trusted
        if isinstance(spec, type) and hasattr(spec, "model_validate_json"):
            self.model = spec  # a pydantic model class
            self.schema = self.model.model_json_schema()
            self.name = spec.__name__
            self._check = None
        elif isinstance(spec, dict):
            schema = unwrapped(spec)
            import jsonschema
            import referencing

            if not trusted:
                within_budget(schema)  # before anything costs time in proportion
            try:
                validator_class = jsonschema.validators.validator_for(schema)
                validator_class.check_schema(schema)
            except jsonschema.SchemaError as exc:
                raise ConfigError(
                    f"response_format is not a valid JSON schema: {excerpt(exc.message)}"
                ) from None
            refuse_outside_references(schema, trusted)
            validator_class = counted(validator_class)
            self.schema = schema
            self.name = _name(schema.get("title", "answer"))
            # A registry that retrieves nothing: jsonschema would otherwise fetch a
            # remote $ref itself (with urlopen, on the loop, no timeout).
            self._check = validator_class(
                schema, registry=referencing.Registry(retrieve=retrieve_nothing)
            )
        else:
            raise ConfigError(
                "response_format must be a pydantic model class or a JSON "
                f"schema (a dict), got {type(spec).__name__}"
            )
        self._schema_text = json.dumps(self.schema, separators=(",", ":"))

    @classmethod
    async def from_model_code(cls, spec: Any) -> AnswerFormat:
        """The format model code asked for, built within its budgets (see the class),
        off the loop: checking a schema of ``MAX_SCHEMA_VALUES`` values takes about a
        tenth of a second. The same schema asked again (a loop of ``llm_query`` calls)
        is built once."""
        if isinstance(spec, dict):
            within_budget(unwrapped(spec))  # quick, and before a byte of it is encoded
        try:
            key = json.dumps(spec, sort_keys=True)
        except (TypeError, ValueError):  # not JSON: the constructor says why
            return cls(spec, trusted=False)
        built = _BUILT.get(key)
        if built is None:
            built = await asyncio.to_thread(cls, spec, trusted=False)
            _BUILT[key] = built
            while len(_BUILT) > 64:
                _BUILT.popitem(last=False)
        _BUILT.move_to_end(key)
        return built

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

    def parse(self, text: str, allowance: Allowance | None = None) -> Any:
        """The answer as an object (a pydantic instance or a dict), or InvalidAnswer.
        ``allowance``: what checking its call's answers has left (a fresh one if None),
        spent here for a schema from model code."""
        refuse_oversize(text)
        text = unfenced(text)
        if self.model is not None:
            from pydantic import ValidationError

            try:
                return self.model.model_validate_json(text)
            except ValidationError as exc:
                first = exc.errors()[0]
                where = ".".join(str(p) for p in first.get("loc", ())) or "the answer"
                raise InvalidAnswer(f"{where}: {first.get('msg')}") from None
        started = time.thread_time()
        try:
            value = json.loads(text)
        except ValueError as exc:
            raise InvalidAnswer(f"not JSON ({exc})") from None
        except RecursionError:
            raise InvalidAnswer("nested too deeply to read") from None
        stop = getattr(checking, "stop", None) or threading.Event()
        allowance = None if self.trusted else allowance or Allowance()
        deadline = started + allowance.seconds if allowance else 0.0
        checking.budget = CheckBudget(stop, allowance, deadline)
        try:
            error = next(iter(self._check.iter_errors(value)), None)
        except RecursionError:
            raise InvalidAnswer("nested too deeply to check") from None
        finally:
            checking.budget = None
            if allowance:
                allowance.seconds -= time.thread_time() - started
        if error is not None:
            where = ".".join(str(p) for p in error.absolute_path) or "the answer"
            raise InvalidAnswer(f"{excerpt(where, 100)}: {excerpt(error.message)}")
        return value

    async def checked(self, text: str, allowance: Allowance | None = None) -> Any:
        """``parse``, off the loop for a schema from model code or a long answer (see
        the class)."""
        if self.trusted and len(text) <= PARSED_ON_LOOP:
            return self.parse(text)
        return await abandonable(self.parse, text, allowance)

    async def checked_all(self, texts: list[str | None]) -> list[Any]:
        """Each text parsed (None stays None), or the ``InvalidAnswer`` it raised: in one
        trip off the loop for a schema from model code."""

        def parse_all() -> list[Any]:
            out: list[Any] = []
            for text in texts:
                try:
                    out.append(None if text is None else self.parse(text))
                except InvalidAnswer as problem:
                    out.append(problem)
            return out

        if self.trusted and sum(len(text or "") for text in texts) <= PARSED_ON_LOOP:
            return parse_all()
        return await abandonable(parse_all)


def _name(title: str) -> str:
    # OpenAI takes names of letters, digits, '_' and '-', up to 64 characters.
    return re.sub(r"[^A-Za-z0-9_-]", "_", str(title))[:64] or "answer"
