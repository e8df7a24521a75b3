"""Typed answers: ``response_format=`` turns a model's answer into a validated object.

The format is a pydantic model (notebook side: answers are instances of it) or a JSON
schema (both sides; answers are dicts, what the sandbox can receive). The request sends
the schema itself (the provider's structured-output mode, which llama.cpp and vLLM
enforce with a grammar) where the model takes one: litellm says so
(``litellm.supports_response_schema``), or its server does (the window probe found
llama.cpp or vLLM). A model litellm does not know, at an OpenAI-compatible server of
the user's, is sent the schema too, and in the prompt as well, until its server is
known; a server that refuses the schema is asked again at once in JSON mode with the
schema in the prompt, and so is that model from then on. Whenever the schema is not
sent, a warning says so, once per model (a small model may not follow a schema it only
reads). Every answer is checked here either way: one that does not validate is asked
again once, with the error; a second failure is that item's error, like any failed call.
"""

from __future__ import annotations

import asyncio
import json
import re
import threading
import time
import warnings
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar

from ..errors import ConfigError, InvalidAnswer, LLMQueryError
from . import price_map
from .litellm_loader import load_litellm
from .profiles import PROFILES

if TYPE_CHECKING:
    from .completion import Completion

_T = TypeVar("_T")


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
    real cost (see ``_Budget``) and ``MAX_CHECK_SECONDS`` of the thread's time. No schema
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
            schema = _unwrapped(spec)
            import jsonschema
            import referencing

            if not trusted:
                _within_budget(schema)  # before anything costs time in proportion
            try:
                validator_class = jsonschema.validators.validator_for(schema)
                validator_class.check_schema(schema)
            except jsonschema.SchemaError as exc:
                raise ConfigError(
                    f"response_format is not a valid JSON schema: {_excerpt(exc.message)}"
                ) from None
            _refuse_outside_references(schema, trusted)
            validator_class = _counted(validator_class)
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

    @classmethod
    async def from_model_code(cls, spec: Any) -> AnswerFormat:
        """The format model code asked for, built within its budgets (see the class),
        off the loop: checking a schema of ``MAX_SCHEMA_VALUES`` values takes about a
        tenth of a second. The same schema asked again (a loop of ``llm_query`` calls)
        is built once."""
        if isinstance(spec, dict):
            _within_budget(_unwrapped(spec))  # quick, and before a byte of it is encoded
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
        _refuse_oversize(text)
        text = _unfenced(text)
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
        stop = getattr(_work, "stop", None) or threading.Event()
        allowance = None if self.trusted else allowance or Allowance()
        deadline = started + allowance.seconds if allowance else 0.0
        _work.budget = _Budget(stop, allowance, deadline)
        try:
            error = next(iter(self._check.iter_errors(value)), None)
        except RecursionError:
            raise InvalidAnswer("nested too deeply to check") from None
        finally:
            _work.budget = None
            if allowance:
                allowance.seconds -= time.thread_time() - started
        if error is not None:
            where = ".".join(str(p) for p in error.absolute_path) or "the answer"
            raise InvalidAnswer(f"{_excerpt(where, 100)}: {_excerpt(error.message)}")
        return value

    async def checked(self, text: str, allowance: Allowance | None = None) -> Any:
        """``parse``, off the loop for a schema from model code or a long answer (see
        the class)."""
        if self.trusted and len(text) <= _PARSED_ON_LOOP:
            return self.parse(text)
        return await _abandonable(self.parse, text, allowance)

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

        if self.trusted and sum(len(text or "") for text in texts) <= _PARSED_ON_LOOP:
            return parse_all()
        return await _abandonable(parse_all)


# A schema from model code: the most values it may hold, and schema nodes once its
# references are followed (a doubling chain of 18 $refs is 262,144 of them); the units
# of work (``_Budget``) and the thread CPU time that checking a call's answers may take
# (its answer and, if that did not match, the one asked again).
MAX_SCHEMA_VALUES = 2_000
MAX_SCHEMA_CHARS = 100_000  # of its names and texts
MAX_EXPANDED_NODES = 10_000
MAX_CHECKS = 150_000
MAX_CHECK_SECONDS = 1.0
# Any answer: decoding holds the interpreter's lock, so the loop waits for it whatever
# thread decodes (4 MB of JSON: about 40 ms); a decoded value takes up to about 70
# bytes (a list of 10 million empty objects is 30 MB of text and 700 MB decoded).
MAX_ANSWER_CHARS = 4 * 2**20
MAX_ANSWER_VALUES = 200_000
_PARSED_ON_LOOP = 64 * 2**10  # a longer answer to the notebook's own schema: in a thread
_ERROR_UNITS = 2  # an error built (about 5 µs), and a unit per this many characters of
_ERROR_CHARS_PER_CHECK = 16  # its text, which quotes the value
_REFERENCE_UNITS = 4  # a $ref followed: a lookup and a validator made
# Names whose meaning would let a schema from model code refer other than by a plain
# "#/..." pointer into itself (the expansion above follows only those).
_UNTRUSTED_KEYWORDS = frozenset(
    {"$id", "$anchor", "$dynamicRef", "$dynamicAnchor", "$recursiveRef", "$recursiveAnchor"}
)
# Keywords whose check reads each item or property of the answer's value: they cost
# that many units, not one.
_READS_INSTANCE = frozenset(
    {
        "items",
        "prefixItems",
        "additionalItems",
        "contains",
        "additionalProperties",
        "propertyNames",
        "patternProperties",
    }
)
# Keywords that compare the answer's value with each value of their own, nested ones too.
_COMPARES_VALUES = frozenset({"enum", "const"})
_BUILT: OrderedDict[str, AnswerFormat] = OrderedDict()  # model code's formats, by schema
_work = threading.local()  # this thread's stop flag, and the budget of the answer it checks


class AnswerTooCostly(InvalidAnswer):
    """An answer that would take more than its budget to check against its schema."""


class Allowance:
    """What checking a call's answers against a schema from model code may take:
    ``MAX_CHECKS`` units of work (see ``_Budget``) and ``MAX_CHECK_SECONDS`` of a
    thread's CPU time, shared by its answer and the one asked again if it did not match."""

    def __init__(self) -> None:
        self.units = MAX_CHECKS
        self.seconds = MAX_CHECK_SECONDS


class _Abandoned(Exception):
    """The call waiting for a check was cancelled: the check stops where it is."""


class _Budget:
    """The work checking one answer spends from its call's ``Allowance`` (None: no limit,
    the notebook's own schema), counted at its real cost: a unit is a few microseconds
    of a thread's time (a keyword applied, an item or property it reads, a value of
    ``enum`` or ``const`` it compares with, a value ``uniqueItems`` reads, 16 characters
    of an error's text, which quotes the value). The thread's CPU time is read every few
    hundred units; whether the waiting call was cancelled, at every step."""

    def __init__(self, stop: threading.Event, allowance: Allowance | None, deadline: float):
        self.stop = stop
        self.allowance = allowance
        self.deadline = deadline  # of time.thread_time()
        self._until_clock = 256

    def spend(self, units: int) -> None:
        if self.stop.is_set():
            raise _Abandoned
        allowance = self.allowance
        if allowance is None:
            return
        allowance.units -= units
        if allowance.units < 0:
            raise AnswerTooCostly(
                f"checking it against this schema takes more than {MAX_CHECKS:,} steps: "
                "ask for a smaller answer or a simpler schema"
            )
        self._until_clock -= units
        if self._until_clock <= 0:
            self._until_clock = 256
            if time.thread_time() > self.deadline:
                raise AnswerTooCostly(
                    f"checking it against this schema takes more than {MAX_CHECK_SECONDS:g} s "
                    "of the kernel's time: ask for a smaller answer or a simpler schema"
                )


async def _abandonable(work: Callable[..., _T], *args: Any) -> _T:
    """``work(*args)`` in a thread that stops at its next step (``_Budget.spend``) once
    the task awaiting it is cancelled, rather than run on past the step that asked."""
    stop = threading.Event()

    def run() -> _T:
        _work.stop = stop
        try:
            return work(*args)
        finally:
            _work.stop = None

    try:
        return await asyncio.to_thread(run)
    finally:
        stop.set()


def _refuse_oversize(text: str) -> None:
    """InvalidAnswer for an answer over ``MAX_ANSWER_CHARS`` or ``MAX_ANSWER_VALUES``,
    before it is decoded. Every value but the first follows a ',', '[', '{' or ':', so
    their count bounds the values (and keys) from above."""
    if len(text) > MAX_ANSWER_CHARS:
        raise AnswerTooCostly(
            f"an answer of {len(text):,} characters, over the {MAX_ANSWER_CHARS:,} "
            "a typed answer may hold"
        )
    values = 1 + sum(text.count(mark) for mark in ",[{:")
    if values > MAX_ANSWER_VALUES:
        raise AnswerTooCostly(
            f"an answer of up to {values:,} JSON values, over the {MAX_ANSWER_VALUES:,} "
            "a typed answer may hold"
        )


def _unfenced(text: str) -> str:
    """The JSON inside a code fence (JSON mode on some models still wraps the object in
    one: "```json\n{...}\n```"), found by string operations: a regular expression here
    backtracked for seconds over an answer of 2,000 blank lines."""
    body = text.strip()
    if len(body) < 6 or not (body.startswith("```") and body.endswith("```")):
        return text
    body = body[3:-3]
    if body.startswith("json") and body[4:5].isspace():
        body = body[4:]
    inner = body.strip()
    if not inner:
        return inner if body.count("\n") >= 2 else text
    opening, closing = body[: len(body) - len(body.lstrip())], body[len(body.rstrip()) :]
    return inner if "\n" in opening and "\n" in closing else text


def _unwrapped(spec: dict[str, Any]) -> Any:
    """The schema itself, out of OpenAI's ``{"type": "json_schema", ...}`` wrapping."""
    if spec.get("type") == "json_schema" and isinstance(spec.get("json_schema"), dict):
        return spec["json_schema"].get("schema") or {}
    return spec


def _counted(validator_class: Any) -> Any:
    """``validator_class`` whose every keyword check spends its real cost from this
    thread's ``_Budget`` (see there), with ``uniqueItems`` checked in linear time."""
    counted = _COUNTED.get(validator_class)
    if counted is None:
        import jsonschema

        def spend(keyword: str, check: Callable[..., Any]) -> Callable[..., Any]:
            compares, reads = keyword in _COMPARES_VALUES, keyword in _READS_INSTANCE
            base = _REFERENCE_UNITS if keyword in ("$ref", "$dynamicRef") else 1

            def checked(validator: Any, value: Any, instance: Any, schema: Any) -> Any:
                budget: _Budget | None = getattr(_work, "budget", None)
                if budget is None:
                    return check(validator, value, instance, schema)
                if budget.allowance is None:  # the notebook's schema: stoppable, not metered
                    if budget.stop.is_set():
                        raise _Abandoned
                    return check(validator, value, instance, schema)
                cost = base + (_values_in(value) if compares else _width(value))
                if reads:
                    cost += _width(instance)
                budget.spend(cost)
                return _metered(check(validator, value, instance, schema), budget)

            return checked

        validators = {
            name: spend(name, check) for name, check in validator_class.VALIDATORS.items()
        }
        if "uniqueItems" in validators:
            validators["uniqueItems"] = spend("uniqueItems", _unique_items)
        for keyword, shortcut in (("anyOf", _any_of), ("oneOf", _one_of)):
            if keyword in validators:
                validators[keyword] = spend(keyword, shortcut(validator_class.VALIDATORS[keyword]))
        counted = _COUNTED[validator_class] = jsonschema.validators.extend(
            validator_class, validators
        )
    return counted


def _metered(errors: Any, budget: _Budget) -> Iterator[Any]:
    """A keyword's errors, each paid for by the length of its text (jsonschema's quote
    the whole value: an anyOf of 900 types against an 8 MB list made 7 GB of them)."""
    for error in errors or ():
        budget.spend(_ERROR_UNITS + len(error.message) // _ERROR_CHARS_PER_CHECK)
        yield error


def _any_of(check: Callable[..., Any]) -> Callable[..., Any]:
    """``anyOf`` that first tries the alternatives that only name a ``const``, ``enum``
    or ``type`` without building an error for each that fails (a list of 500 items,
    each against 100 consts, built 50,000 of them: half a second); else as ``check``."""
    from jsonschema._utils import equal

    def any_of(validator: Any, alternatives: Any, instance: Any, schema: Any) -> Any:
        budget: _Budget | None = getattr(_work, "budget", None)
        others = False
        for each in alternatives:
            fits = _fits_simply(validator, each, instance, equal, budget)
            if fits:
                return
            others = others or fits is None
        if others:
            yield from check(validator, alternatives, instance, schema)
        else:
            yield _error(f"{instance!r} is not valid under any of the given schemas")

    return any_of


def _one_of(check: Callable[..., Any]) -> Callable[..., Any]:
    """``oneOf`` decided as ``_any_of`` is when every alternative is that simple."""
    from jsonschema._utils import equal

    def one_of(validator: Any, alternatives: Any, instance: Any, schema: Any) -> Any:
        budget: _Budget | None = getattr(_work, "budget", None)
        fits = [_fits_simply(validator, each, instance, equal, budget) for each in alternatives]
        if None in fits:
            yield from check(validator, alternatives, instance, schema)
        elif True not in fits:
            yield _error(f"{instance!r} is not valid under any of the given schemas")
        elif fits.count(True) > 1:
            yield _error(f"{instance!r} is valid under more than one of the given schemas")

    return one_of


_SIMPLE_KEYWORDS = frozenset({"const", "enum", "type"})


def _fits_simply(
    validator: Any, schema: Any, instance: Any, equal: Callable[[Any, Any], bool], budget: Any
) -> bool | None:
    """Whether ``instance`` fits a schema that only names a ``const``, an ``enum`` or a
    ``type`` (a unit per value compared), or None for any other schema."""
    if not isinstance(schema, dict) or not schema or not schema.keys() <= _SIMPLE_KEYWORDS:
        return None
    if budget is not None:
        budget.spend(sum(_values_in(value) for value in schema.values()))
    if "const" in schema and not equal(instance, schema["const"]):
        return False
    if "enum" in schema and not any(equal(each, instance) for each in schema["enum"]):
        return False
    types = schema.get("type", ())
    return not types or any(
        validator.is_type(instance, kind) for kind in ([types] if isinstance(types, str) else types)
    )


def _error(message: str) -> Any:
    from jsonschema.exceptions import ValidationError

    return ValidationError(message)


def _width(value: Any) -> int:
    return len(value) if isinstance(value, (list, dict)) else 0


def _values_in(value: Any) -> int:
    """How many values ``value`` holds, nested ones included."""
    count, stack = 0, [value]
    while stack:
        node = stack.pop()
        count += 1
        if isinstance(node, dict):
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
    return count


def _unique_items(validator: Any, unique: Any, instance: Any, schema: Any) -> Iterator[Any]:
    """``uniqueItems`` in time linear in the array: jsonschema compares unsortable items
    (objects) pairwise, 10 s of CPU for 3,000 of them. Each item becomes a key equal for
    equal JSON values (1 and 1.0 alike, true and 1 not), hashed through strings, whose
    hashes are salted: numbers chosen to collide cannot make the set quadratic."""
    if not (unique and validator.is_type(instance, "array")):
        return
    from jsonschema.exceptions import ValidationError

    budget: _Budget | None = getattr(_work, "budget", None)
    seen: dict[Any, int] = {}
    for index, item in enumerate(instance):
        key = _key(item, budget)
        if key in seen:
            yield ValidationError(f"items {seen[key]} and {index} are equal, and must be unique")
            return
        seen[key] = index


def _key(value: Any, budget: _Budget | None) -> Any:
    """A hashable key equal for values JSON Schema calls equal, a unit per value."""
    if budget is not None:
        budget.spend(1)
    if isinstance(value, str):
        return value
    if value is True or value is False or value is None:
        return ("literal", repr(value))
    if isinstance(value, int):
        return ("number", hex(value))  # linear in the digits, unlike str()
    if isinstance(value, float):
        whole = value.is_integer()
        return ("number", hex(int(value)) if whole else repr(value))
    if isinstance(value, list):
        return ("array", tuple(_key(item, budget) for item in value))
    if isinstance(value, dict):
        return ("object", frozenset((name, _key(item, budget)) for name, item in value.items()))
    return ("other", repr(value))


_COUNTED: dict[Any, Any] = {}


def _within_budget(schema: Any) -> None:
    """One-line errors for a schema from model code over its budgets (see
    ``AnswerFormat``): its values counted, its references followed, each at most once
    per node, so this is quick whatever the schema is."""
    values, chars = 0, 0
    for node, kind in _parts(schema):
        values += 1
        if values > MAX_SCHEMA_VALUES:
            raise ConfigError(
                f"response_format from model code may hold at most {MAX_SCHEMA_VALUES:,} "
                "values; this one holds more"
            )
        if isinstance(node, str):
            chars += len(node)
        elif isinstance(node, dict):
            chars += sum(len(key) for key in node if isinstance(key, str))
            if kind == "schema":
                for key in _UNTRUSTED_KEYWORDS.intersection(node):
                    raise ConfigError(
                        f"response_format from model code may not use {key}: refer to your "
                        "definitions with '$ref': '#/$defs/name'"
                    )
        if chars > MAX_SCHEMA_CHARS:
            raise ConfigError(
                f"response_format from model code may hold at most {MAX_SCHEMA_CHARS:,} "
                "characters of names and text; this one holds more"
            )
    try:
        _expanded_size(schema)
    except RecursionError:
        raise ConfigError(
            "response_format from model code is nested (or chains its $refs) too deeply"
        ) from None


def _parts(schema: Any) -> Iterator[tuple[Any, str]]:
    """Every value in ``schema``, each with what it is (see ``_kind_below``); lazily,
    so a caller that stops at a budget reads no further."""
    stack: list[tuple[Any, str]] = [(schema, "schema")]
    while stack:
        node, kind = stack.pop()
        yield node, kind
        if isinstance(node, dict):
            stack.extend((value, _kind_below(kind, key)) for key, value in node.items())
        elif isinstance(node, list):
            stack.extend((item, kind) for item in node)


def _kind_below(kind: str, key: Any) -> str:
    """What a value under ``key`` of a dict of this kind is: a schema, a map of names
    to schemas (``properties``), or data (``enum``, ``const``: no keyword in it counts)."""
    if kind == "data":
        return "data"
    if kind == "names":
        return "schema"
    if key in _DATA:
        return "data"
    return "names" if key in _NAMED_SCHEMAS else "schema"


def _expanded_size(root: Any) -> int:
    """The schema nodes a validator may walk, ``$ref``s followed; a ConfigError past
    ``MAX_EXPANDED_NODES`` or for a reference that leads back to itself."""
    sizes: dict[int, int] = {}
    walking: set[int] = set()

    def size(node: Any, kind: str = "schema") -> int:
        if not isinstance(node, (dict, list)) or kind == "data":
            return 1
        known = sizes.get(id(node))
        if known is not None:
            return known
        if id(node) in walking:
            raise ConfigError(
                "response_format from model code may not refer to itself (a recursive "
                "schema): write the nesting out"
            )
        walking.add(id(node))
        if isinstance(node, list):
            total = 1 + sum(size(item, kind) for item in node)
        else:
            total = 1 + sum(size(value, _kind_below(kind, key)) for key, value in node.items())
            if kind == "schema" and isinstance(node.get("$ref"), str):
                total += size(_pointed_at(root, node["$ref"]))
        walking.discard(id(node))
        if total > MAX_EXPANDED_NODES:
            raise ConfigError(
                f"response_format from model code may take at most {MAX_EXPANDED_NODES:,} "
                "schema nodes once its $refs are followed; this one takes more"
            )
        sizes[id(node)] = total
        return total

    return size(root)


def _pointed_at(root: Any, ref: str) -> Any:
    """The part of ``root`` a local "#/..." JSON pointer names."""
    from urllib.parse import unquote

    if not ref.startswith("#") or (len(ref) > 1 and not ref.startswith("#/")):
        raise ConfigError(
            "response_format may refer only to its own definitions ('#/...'), "
            f"not to {_excerpt(ref, 80)!r}"
        )
    node: Any = root
    for part in unquote(ref[2:]).split("/") if len(ref) > 1 else ():
        part = part.replace("~1", "/").replace("~0", "~")
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            raise ConfigError(
                f"response_format's $ref {_excerpt(ref, 80)!r} names nothing in the schema"
            )
    return node


def _excerpt(text: str, limit: int = 300) -> str:
    """Error texts quote what they were given at most this long: a schema or answer
    quoted whole, once per prompt of a batch, was hundreds of MB for nothing."""
    text = str(text)
    return text if len(text) <= limit else f"{text[: limit - 1]}…"


# Keywords whose value maps names to schemas: there the keys are names, not keywords.
_NAMED_SCHEMAS = frozenset(
    {"properties", "patternProperties", "$defs", "definitions", "dependentSchemas"}
)
# Keywords whose value is data, not schema (a "$ref" key inside is no reference).
_DATA = frozenset({"enum", "const", "default", "examples"})


def _refuse_outside_references(schema: Any, trusted: bool) -> None:
    """One-line errors for what a schema may not hold (see ``AnswerFormat``)."""
    for node, kind in _parts(schema):
        if kind != "schema" or not isinstance(node, dict):
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
            if not trusted and key in ("unevaluatedProperties", "unevaluatedItems"):
                raise ConfigError(
                    f"response_format from model code may not use {key} (its check walks "
                    "the schema again for every property): use additionalProperties or items"
                )


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
        _tell_schema_not_sent(model_name, f"its server refused it: {_excerpt(str(error), 160)}")
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
