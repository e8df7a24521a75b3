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

Standard library only: the sandbox worker imports this.
"""

from __future__ import annotations

import io
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

# The only callables a carried pickle may name: constructors of plain values, which
# build the value from its parts and do nothing else.
_PLAIN = {
    "builtins": {
        "bool",
        "bytearray",
        "bytes",
        "complex",
        "dict",
        "float",
        "frozenset",
        "int",
        "list",
        "range",
        "set",
        "slice",
        "str",
        "tuple",
    },
    "collections": {"Counter", "OrderedDict", "defaultdict", "deque"},
    "datetime": {"date", "datetime", "time", "timedelta", "timezone"},
    "decimal": {"Decimal"},
    "fractions": {"Fraction"},
}


class PlainUnpickler(pickle.Unpickler):
    """Loads plain data only: any class or function but ``_PLAIN``'s is refused."""

    def find_class(self, module: str, name: str) -> Any:
        if name in _PLAIN.get(module, ()):
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"{module}.{name} is not plain data")

    def persistent_load(self, pid: Any) -> Any:
        raise pickle.UnpicklingError("a persistent reference is not plain data")


def loads_plain(data: bytes) -> Any:
    return PlainUnpickler(io.BytesIO(data)).load()


def pack(namespace: dict[str, Any]) -> tuple[bytes, list[str], list[list[str]]]:
    """The model's variables that are plain data, pickled (at most ``MAX_CARRIED_BYTES``
    in all), their names, and [name, type] for each one left behind."""
    kept: dict[str, bytes] = {}
    left: list[list[str]] = []
    total = 0
    for name in user_variables(namespace):
        value = namespace[name]
        try:
            data = pickle.dumps(value, protocol=5)
            loads_plain(data)  # what the next process will accept, checked here
        except RecursionError:
            left.append([name, "nested too deeply"])
            continue
        except Exception:  # noqa: BLE001 - anything but plain data stays behind
            left.append([name, type(value).__name__[:100]])
            continue
        if total + len(data) > MAX_CARRIED_BYTES:
            left.append([name, f"{type(value).__name__[:100]}, past the {_mb()} kept"])
            continue
        kept[name] = data
        total += len(data)
    return pickle.dumps(kept, protocol=5), list(kept)[:MAX_NAMES], left[:MAX_NAMES]


def unpack(data: bytes) -> dict[str, Any]:
    """The variables a ``pack`` made, for a fresh namespace: each loaded as plain data,
    under a name the model could have made (no scaffold, no private name)."""
    variables: dict[str, Any] = {}
    outer = loads_plain(data)
    if not isinstance(outer, dict):
        raise pickle.UnpicklingError("carried variables that are not a dict")
    for name, pickled in outer.items():
        if not (isinstance(name, str) and name.isidentifier() and isinstance(pickled, bytes)):
            continue
        if user_variables({name: None}) != [name]:
            continue  # a helper's, the context's, or a private name: put in by the REPL
        try:
            variables[name] = loads_plain(pickled)
        except Exception:  # noqa: BLE001 - a value that does not load stays behind
            continue
    return variables


def _mb() -> str:
    return f"{MAX_CARRIED_BYTES // 2**20} MB"


@dataclass(frozen=True)
class Carried:
    """What a sandboxed session keeps of a question's variables for the next: the
    pickled plain data (loaded only by the next sandbox), the names in it, and the
    names left behind with their types."""

    data: bytes
    names: tuple[str, ...] = ()
    left: tuple[tuple[str, str], ...] = ()
