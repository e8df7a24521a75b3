"""A function's map: a user's async function called on each of many items (the
notebook's ``amap``), with what a prompt's map has: the outcome that keeps every
finished result through an interrupt, the observer behind the progress bar, and results
kept on disk so a re-run calls the function only on the items still without one.

The function may ask models itself (``llm_query``, twice a row), and those calls take
the client's slots. So the map admits functions through a limiter of its own, which
counts functions under way, not requests: had it taken client slots, functions holding
every slot would wait forever for one more for their own ``llm_query``.

A function's map is known by the function and its items (``function_map_key``). The
function is read as far as that can be done: its source, its defaults and closure, the
plain values (str, numbers...) of the globals it reads and the functions of its own
module it calls, so a prompt template edited between an interrupt and the re-run starts
the map afresh instead of handing back answers to the old one.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import hashlib
import inspect
import json
import re
import types
import warnings
from collections.abc import Callable, Sequence
from typing import Any

from ..llm.limiter import ConcurrencyLimiter
from ..llm.usage import UsageLedger
from .gather import BatchOutcome, gather_limited
from .resume import OFF_LOOP_AT, RESUME_AT, MapStore
from .run_map import MapObserver, MapOutcome, Placed

# The ledger of the function's map an item's call runs in (set in the item's own task):
# the helpers record their calls there, so the map's bar counts its own calls, not those
# another map (or cell) makes at the same time.
_MAP_LEDGER: contextvars.ContextVar[UsageLedger | None] = contextvars.ContextVar(
    "rlm_magic_map_ledger", default=None
)


def map_ledger() -> UsageLedger | None:
    """The ledger of the function's map whose item is running here, if any."""
    return _MAP_LEDGER.get()


# How deep the functions a mapped function calls are read into its key.
_CALLED_DEPTH = 3
# In a repr, what changes from one process to the next: the object's address.
_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")


async def map_function(
    fn: Callable[[Any], Any],
    items: Sequence[Any],
    limiter: ConcurrencyLimiter,
    *,
    cache_dir: str,
    resume: bool | None = None,
    settings: Any = None,
    observer: MapObserver | None = None,
    outcome: MapOutcome | None = None,
    ledger: UsageLedger | None = None,
) -> tuple[list[Any], dict[int, Exception]]:
    """Await ``fn(item)`` for every item, at most as many at once as ``limiter`` admits;
    return ``(results, errors)`` as ``run_map`` does: ``results[i]`` is None where item i
    failed, and ``errors`` maps the failed items to their exceptions.

    ``resume`` (None: from ``RESUME_AT`` items on) keeps each result that is JSON under
    ``cache_dir`` as it arrives; ``settings`` (what the function's own calls are asked
    with, e.g. the sub-model) is part of the map's key. Cancelled (an interrupt), every
    call under way is cancelled and awaited; ``outcome`` then holds what had arrived.
    ``ledger``: where the calls ``fn`` makes through the helpers are recorded too
    (``map_ledger``), a child of the client's."""
    observer = observer if observer is not None else MapObserver()
    outcome = outcome if outcome is not None else MapOutcome(len(items))
    outcome.results_are_values = True
    store = None
    if resume or (resume is None and len(items) >= RESUME_AT):
        if len(items) >= OFF_LOOP_AT:
            key = await asyncio.to_thread(function_map_key, fn, items, settings)
        else:
            key = function_map_key(fn, items, settings)
        if resume:
            _warn_if_unstable(items)
        store = MapStore(cache_dir, key)
        kept = await store.load_kept()
        outcome.kept = {index: entry["value"] for index, entry in kept.items() if "value" in entry}
        outcome.on_disk = True
    outcome.sent = [i for i in range(len(items)) if i not in outcome.kept]
    observer.kept(len(outcome.kept))
    outcome.gathered = BatchOutcome(len(outcome.sent))
    calls = [functools.partial(_call, fn, items[i], ledger) for i in outcome.sent]
    try:
        await gather_limited(
            calls,
            limiter,
            Placed(outcome.sent, observer, store.add_value if store is not None else None),
            outcome.gathered,
        )
    finally:
        if store is not None:
            store.close()
    errors = outcome.failures()
    if store is not None:
        if store.not_json and resume:
            warnings.warn(
                f"{store.not_json} of {len(outcome.sent)} results were not kept on disk: "
                "only JSON results are (str, numbers, bools, None, lists, dicts with str "
                "keys); a re-run calls the function on those items again",
                RuntimeWarning,
                stacklevel=2,
            )
        if not errors:
            store.remove()  # finished: nothing left to resume
    return outcome.answers(), errors


async def _call(fn: Callable[[Any], Any], item: Any, ledger: UsageLedger | None) -> Any:
    if ledger is not None:
        _MAP_LEDGER.set(ledger)  # (in this item's own task: it goes with the task)
    result = fn(item)
    if not inspect.isawaitable(result):
        raise TypeError(
            f"the mapped function returned a {type(result).__name__}, not an awaitable: "
            "map an `async def` function (or a lambda returning a coroutine)"
        )
    return await result


def function_map_key(fn: Callable[..., Any], items: Sequence[Any], settings: Any = None) -> str:
    """The key of the map of ``fn`` over ``items``: the function as far as it can be read
    (``function_identity``), the settings its calls use, and every item, in order (as
    JSON, or its repr)."""
    head = {"function": function_identity(fn), "settings": settings}
    digest = hashlib.sha256(b"function map\n")
    digest.update(json.dumps(head, sort_keys=True, default=repr).encode())
    for item in items:
        digest.update(b"\n")
        digest.update(_canonical(item).encode())
    return digest.hexdigest()


def _warn_if_unstable(items: Sequence[Any]) -> None:
    """An item known only by a repr naming its address is another item in the next
    process: a map of it never resumes. Say so when resuming was asked for."""
    for index, item in enumerate(items):
        if _ADDRESS.search(_canonical(item)):
            warnings.warn(
                f"this map cannot resume: item {index} (a {type(item).__name__}) has no "
                "form that stays the same in the next process (its repr names its memory "
                "address); map over plain data (str, dicts, rows), or give it a __repr__",
                RuntimeWarning,
                stacklevel=3,
            )
            return


def function_identity(fn: Any, depth: int = 0, seen: set[int] | None = None) -> Any:
    """What ``fn``'s results depend on, as far as it can be read without running it."""
    seen = seen if seen is not None else set()
    if isinstance(fn, functools.partial):
        return {
            "partial": function_identity(fn.func, depth, seen),
            "args": _plain(fn.args),
            "keywords": _plain(fn.keywords),
        }
    if isinstance(fn, types.MethodType):
        return {"method": function_identity(fn.__func__, depth, seen), "of": _plain(fn.__self__)}
    if not isinstance(fn, types.FunctionType):
        return {"callable": f"{type(fn).__module__}.{type(fn).__qualname__}", "plain": _plain(fn)}
    seen.add(id(fn))
    code = fn.__code__
    try:
        source: Any = inspect.getsource(fn)
    except (OSError, TypeError):  # no source (exec'd code): the compiled code, then
        source = _code_identity(code)
    read: dict[str, Any] = {}
    for name in sorted(_names_read(code)):
        if name not in fn.__globals__:
            continue  # a builtin, or a global not defined yet
        value = fn.__globals__[name]
        if (
            isinstance(value, types.FunctionType)
            and value.__module__ == fn.__module__
            and depth < _CALLED_DEPTH
            and id(value) not in seen
        ):
            read[name] = function_identity(value, depth + 1, seen)
        elif _plain(value) is not None:
            read[name] = _plain(value)
    closure = []
    for cell in fn.__closure__ or ():
        try:
            closure.append(_plain(cell.cell_contents))
        except ValueError:  # an empty cell (a name assigned later)
            closure.append(None)
    return {
        "name": f"{fn.__module__}.{fn.__qualname__}",
        "source": source,
        "defaults": _plain(fn.__defaults__),
        "kwdefaults": _plain(fn.__kwdefaults__),
        "closure": closure,
        "globals": read,
    }


def _names_read(code: types.CodeType) -> set[str]:
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):  # a nested function, a comprehension
            names |= _names_read(const)
    return names


def _code_identity(code: types.CodeType) -> Any:
    """Compiled code without what changes from one definition to the next (its file
    name, line numbers, addresses)."""
    return [
        code.co_code.hex(),
        [_code_identity(c) if isinstance(c, types.CodeType) else _plain(c) for c in code.co_consts],
        list(code.co_names),
    ]


_PLAIN_TYPES = (str, bytes, int, float, complex, bool, type(None))


def _plain(value: Any, depth: int = 0) -> Any:
    """``value`` as JSON-able data if it is plain data (str, numbers, None, and tuples,
    lists, sets and dicts of them), else None. Sets are sorted: their order changes
    from one process to the next."""
    if isinstance(value, _PLAIN_TYPES):
        return repr(value)
    if depth > 8:
        return None
    if isinstance(value, (tuple, list)):
        parts = [_plain(v, depth + 1) for v in value]
        return None if any(p is None for p in parts) else [type(value).__name__, parts]
    if isinstance(value, (set, frozenset)):
        parts = [_plain(v, depth + 1) for v in value]
        return None if any(p is None for p in parts) else ["set", sorted(parts, key=json.dumps)]
    if isinstance(value, dict):
        pairs = [(_plain(k, depth + 1), _plain(v, depth + 1)) for k, v in value.items()]
        if any(k is None or v is None for k, v in pairs):
            return None
        return ["dict", sorted(pairs, key=json.dumps)]
    return None


def _canonical(item: Any) -> str:
    """An item as text that is the same for an equal item in another process: JSON
    (a pandas row through its ``to_dict``), or else its repr."""
    try:
        return json.dumps(item, sort_keys=True, ensure_ascii=False, default=_jsonable)
    except (TypeError, ValueError, RecursionError):
        return repr(item)


def _jsonable(value: Any) -> Any:
    to_dict = getattr(value, "to_dict", None)
    if callable(to_dict):  # a pandas Series (a DataFrame's row), a dataclass-like record
        try:
            return {"type": type(value).__qualname__, "data": to_dict()}
        except Exception:  # noqa: BLE001 - any failure: fall back to repr
            pass
    return repr(value)
