"""A session's variables, carried from one question's sandbox process to the next as
plain data.

Each question of a sandboxed session runs in a fresh process: code from an earlier
question (a poisoned document's) may have rewritten anything in its own process,
including the code that reports how a step finished, so nothing of that process may
decide a later answer. What crosses is data only. The old process pickles each of the
model's variables (``pack``), and keeps those that load back with ``PlainUnpickler``,
which builds containers, numbers, text and a short list of value types, and refuses
every other class or function: a pickle from hostile code can make values, never run
code. The kernel holds the bytes without decoding them (it never unpickles what a
sandbox sends), and the next question's fresh process loads them (``unpack``) before
any model code runs. Functions, classes, modules and other objects stay behind; the
model is told their names.

Hostile code may also hand on values meant to mislead the next question's honest code
or to stall its start. So no carried value may take a builtin's name (``str = ()``
would turn ``isinstance(x, str)`` False), the allowed constructors build in time and
memory linear in what the pickle holds, loading that swells the process far past the
pickle's size is refused whole (``Tampered``), and the kernel gives the loading a
deadline (``sandbox/process.py``): either way the question fails saying why, and the
session drops what was carried.

Standard library only: the sandbox worker imports this.
"""

from __future__ import annotations

import builtins
import collections
import io
import os
import pickle
from dataclasses import dataclass
from typing import Any

from .namespace import user_variables

# What the next question may hold of the last one's variables, pickled: the kernel
# keeps this much per session between questions.
MAX_CARRIED_BYTES = 32 * 2**20
# They go to the kernel in parts this large (base64 in a JSON frame).
PART_BYTES = 3 * 2**20
# Names listed (carried, and left behind), at most.
MAX_NAMES = 1_000
# Plain data takes at most about this many times its pickle's size in memory (a list of
# empty lists, the worst honest case, takes ~25x); a pickle that makes its loader grow
# more (memo references fed to constructors again and again) is refused whole.
MAX_GROWTH = 64
GROWTH_ALLOWANCE = 16 * 2**20

# The only callables a carried pickle may name: constructors that build a value in time
# and memory linear in their arguments, which the pickle itself holds. Not bytes(n),
# range(n) or int(text): those would let a few bytes ask for gigabytes or hours.
_PLAIN = {
    "builtins": {"complex"},
    "collections": {"Counter", "OrderedDict", "deque"},
    "datetime": {"date", "datetime", "time", "timedelta", "timezone"},
    "rlm_magic.repl.carried": {"defaultdict_of"},
}
# A defaultdict crosses with its factory by name, from these.
_FACTORIES = {"list": list, "dict": dict, "set": set, "int": int, "float": float, "str": str}


def defaultdict_of(factory: str, items: dict[Any, Any]) -> collections.defaultdict[Any, Any]:
    """A defaultdict from its factory's name and its items (see ``_Packer``)."""
    if factory not in _FACTORIES or not isinstance(items, dict):
        raise pickle.UnpicklingError("not a defaultdict of plain values")
    return collections.defaultdict(_FACTORIES[factory], items)


class PlainUnpickler(pickle.Unpickler):
    """Loads plain data only: any class or function but ``_PLAIN``'s is refused."""

    def find_class(self, module: str, name: str) -> Any:
        if name in _PLAIN.get(module, ()):
            if module == __name__:
                return defaultdict_of
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"{module}.{name} is not plain data")

    def persistent_load(self, pid: Any) -> Any:
        raise pickle.UnpicklingError("a persistent reference is not plain data")


class _Packer(pickle.Pickler):
    """Pickles a defaultdict as its factory's name and items, so that loading it needs
    no builtin type as a callable."""

    def reducer_override(self, obj: Any) -> Any:
        if type(obj) is collections.defaultdict:
            for name, factory in _FACTORIES.items():
                if obj.default_factory is factory:
                    return defaultdict_of, (name, dict(obj))
        return NotImplemented


def loads_plain(data: bytes) -> Any:
    return PlainUnpickler(io.BytesIO(data)).load()


def _dumps(value: Any) -> bytes:
    out = io.BytesIO()
    _Packer(out, protocol=5).dump(value)
    return out.getvalue()


def pack(namespace: dict[str, Any]) -> tuple[bytes, list[str], list[list[str]]]:
    """The model's variables that are plain data, pickled (at most ``MAX_CARRIED_BYTES``
    in all), their names, and [name, type] for each one left behind."""
    kept: dict[str, bytes] = {}
    left: list[list[str]] = []
    total = 0
    for name in user_variables(namespace):
        value = namespace[name]
        kind = type(value).__name__[:100]
        if name in _BUILTIN_NAMES:
            left.append([name, f"{kind}, named as a Python builtin"])
            continue
        try:
            data = _dumps(value)
            loads_plain(data)  # what the next process will accept, checked here
        except RecursionError:
            left.append([name, f"{kind}, nested too deeply"])
            continue
        except Exception:  # noqa: BLE001 - anything but plain data stays behind
            left.append([name, kind])
            continue
        if total + len(data) > MAX_CARRIED_BYTES:
            left.append([name, f"{kind}, past the {_mb()} kept"])
            continue
        kept[name] = data
        total += len(data)
    return pickle.dumps(kept, protocol=5), list(kept)[:MAX_NAMES], left[:MAX_NAMES]


def unpack(data: bytes) -> dict[str, Any]:
    """The variables a ``pack`` made, for a fresh namespace: each loaded as plain data,
    under a name the model could have made (no scaffold, no private name, no builtin's:
    a plain value named ``str`` or ``ValueError`` would change what honest code does).
    Raises ``Tampered`` when one of them grew this process far past its own size (each
    is measured alone: a large honest value beside it cannot make room for a swelling
    one)."""
    variables: dict[str, Any] = {}
    outer = loads_plain(data)
    if not isinstance(outer, dict):
        raise Tampered("carried variables that are not a dict of pickles")
    for name, pickled in outer.items():
        if not (isinstance(name, str) and name.isidentifier() and isinstance(pickled, bytes)):
            continue
        if user_variables({name: None}) != [name] or name in _BUILTIN_NAMES:
            continue  # the REPL's own, a private name, or a builtin's
        before = _resident()
        try:
            variables[name] = loads_plain(pickled)
        except Exception:  # noqa: BLE001 - a value that does not load stays behind
            continue
        grown = _resident() - before
        if grown > GROWTH_ALLOWANCE + MAX_GROWTH * len(pickled):
            raise Tampered(
                f"loading {name!r} from {len(pickled):,} bytes took {grown // 2**20:,} MB, "
                "far more than plain data takes"
            )
    return variables


def _resident() -> int:
    """Bytes this process holds in memory now (its own /proc in the sandbox)."""
    try:
        with open("/proc/self/statm") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        pass
    try:
        import resource
    except ImportError:  # WebAssembly (the wasm sandbox): its memory, which only grows
        import pyodide_js  # type: ignore[import-not-found]

        return int(pyodide_js._module.HEAP8.length)
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # the peak


class Tampered(Exception):
    """Carried variables that no honest ``pack`` makes."""


_BUILTIN_NAMES = frozenset(dir(builtins))


def _mb() -> str:
    return f"{MAX_CARRIED_BYTES // 2**20} MB"


@dataclass(frozen=True)
class Carried:
    """What a sandboxed session keeps of a question's variables for the next: the
    pickled plain data (loaded only by the next sandbox), the names in it, and the
    names left behind with their types."""

    parts: tuple[bytes, ...]  # the pickle, in the parts it crossed in
    names: tuple[str, ...] = ()
    left: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class SessionStart:
    """What a session's later question starts its sandbox with: the variables the last
    question left (``carried``), and its earlier contexts, each under its name as the
    kernel pickled it."""

    carried: Carried | None = None
    earlier_contexts: tuple[tuple[str, bytes], ...] = ()
