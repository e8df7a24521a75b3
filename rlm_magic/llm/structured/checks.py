"""How a typed answer is checked within bounds: what a schema from model code may hold,
what any answer may weigh, and the validator wrapped so that each check spends its real
cost from the call's allowance, off the loop and stopped once nobody waits for it.

Why one module: the bounds, the units they are counted in and the validator hooks that
spend them are one budget; read apart, a keyword could be checked without being paid for.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, NoReturn, TypeVar

from ...errors import ConfigError, InvalidAnswer

_T = TypeVar("_T")

# A schema from model code: the most values it may hold, and schema nodes once its
# references are followed (a doubling chain of 18 $refs is 262,144 of them); the units
# of work (``CheckBudget``) and the thread CPU time that checking a call's answers may take
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
PARSED_ON_LOOP = 64 * 2**10  # a longer answer to the notebook's own schema: in a thread
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
checking = threading.local()  # this thread's stop flag, and the budget of the answer it checks


class AnswerTooCostly(InvalidAnswer):
    """An answer that would take more than its budget to check against its schema."""


class Allowance:
    """What checking a call's answers against a schema from model code may take:
    ``MAX_CHECKS`` units of work (see ``CheckBudget``) and ``MAX_CHECK_SECONDS`` of a
    thread's CPU time, shared by its answer and the one asked again if it did not match."""

    def __init__(self) -> None:
        self.units = MAX_CHECKS
        self.seconds = MAX_CHECK_SECONDS


class _Abandoned(Exception):
    """The call waiting for a check was cancelled: the check stops where it is."""


class CheckBudget:
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


async def abandonable(work: Callable[..., _T], *args: Any) -> _T:
    """``work(*args)`` in a thread that stops at its next step (``CheckBudget.spend``) once
    the task awaiting it is cancelled, rather than run on past the step that asked."""
    stop = threading.Event()

    def run() -> _T:
        checking.stop = stop
        try:
            return work(*args)
        finally:
            checking.stop = None

    try:
        return await asyncio.to_thread(run)
    finally:
        stop.set()


def refuse_oversize(text: str) -> None:
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


def unfenced(text: str) -> str:
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


def unwrapped(spec: dict[str, Any]) -> Any:
    """The schema itself, out of OpenAI's ``{"type": "json_schema", ...}`` wrapping."""
    if spec.get("type") == "json_schema" and isinstance(spec.get("json_schema"), dict):
        return spec["json_schema"].get("schema") or {}
    return spec


def counted(validator_class: Any) -> Any:
    """``validator_class`` whose every keyword check spends its real cost from this
    thread's ``CheckBudget`` (see there), with ``uniqueItems`` checked in linear time."""
    counted = _COUNTED.get(validator_class)
    if counted is None:
        import jsonschema

        def spend(keyword: str, check: Callable[..., Any]) -> Callable[..., Any]:
            compares, reads = keyword in _COMPARES_VALUES, keyword in _READS_INSTANCE
            base = _REFERENCE_UNITS if keyword in ("$ref", "$dynamicRef") else 1

            def checked(validator: Any, value: Any, instance: Any, schema: Any) -> Any:
                budget: CheckBudget | None = getattr(checking, "budget", None)
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


def _metered(errors: Any, budget: CheckBudget) -> Iterator[Any]:
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
        budget: CheckBudget | None = getattr(checking, "budget", None)
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
        budget: CheckBudget | None = getattr(checking, "budget", None)
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

    budget: CheckBudget | None = getattr(checking, "budget", None)
    seen: dict[Any, int] = {}
    for index, item in enumerate(instance):
        key = _key(item, budget)
        if key in seen:
            yield ValidationError(f"items {seen[key]} and {index} are equal, and must be unique")
            return
        seen[key] = index


def _key(value: Any, budget: CheckBudget | None) -> Any:
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


def within_budget(schema: Any) -> None:
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
            f"not to {excerpt(ref, 80)!r}"
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
                f"response_format's $ref {excerpt(ref, 80)!r} names nothing in the schema"
            )
    return node


def excerpt(text: str, limit: int = 300) -> str:
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


def refuse_outside_references(schema: Any, trusted: bool) -> None:
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


def retrieve_nothing(uri: str) -> NoReturn:
    from referencing.exceptions import NoSuchResource

    raise NoSuchResource(ref=uri)
