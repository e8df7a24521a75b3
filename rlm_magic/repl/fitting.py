"""What the sandbox worker sends fits the bridge's frames (``bridge.MAX_FROM_SANDBOX``
bytes, ``bridge.MAX_VALUES`` values): an answer too large is cut with a note, the
model's variables cross as JSON or a short repr within one frame, and a batch of
prompts too large for one frame goes in parts whose answers are joined again.

Standard library only: the sandbox worker imports this.
"""

from __future__ import annotations

import concurrent.futures
import json
import threading
from typing import Any

from . import bridge
from .helpers import BATCH_NAMES
from .namespace import user_variables


def wire_size(value: Any) -> int:
    """Bytes ``value`` takes in a frame (strings escaped as ``bridge.frame`` does)."""
    return len(bridge.frame({"v": value})) - 16


# -- answers -----------------------------------------------------------------------------
# FINAL_VAR's text beyond this many bytes on the wire is cut (with a note), so its
# frame stays under the bridge's limit.
FINAL_LIMIT = bridge.MAX_FROM_SANDBOX - 2**20


def fitted(value: str, what: str, limit: int = FINAL_LIMIT) -> str:
    """An answer's text, cut (with a note) to ``limit`` bytes on the wire."""
    if len(value) <= limit // 12:  # 12 bytes a character at most
        return value
    size = wire_size(value)
    if size <= limit:
        return value
    keep = int(len(value) * limit / size * 0.9)
    return (
        value[:keep] + f"\n... [{what} holds {len(value):,} characters, more than "
        f"the sandbox returns ({limit:,} bytes); the rest is cut]"
    )


def fitted_finish(finish: list[str] | None) -> list[str] | None:
    if finish is None:
        return None
    how, answer = finish
    return [how, fitted(answer, "the FINAL answer", FINAL_LIMIT // 2)]


# -- variables ---------------------------------------------------------------------------
# result.variables: values up to this size cross as JSON, larger ones as a short repr;
# all of them together fit one frame the kernel takes (see bridge.py).
_VARIABLE_JSON_LIMIT = 2**20
_VARIABLES_TOTAL_LIMIT = 6 * 2**20
VARIABLES_MOST = 10_000  # variables listed at most (names, result.variables)
_VARIABLES_VALUE_LIMIT = bridge.MAX_VALUES // 2


def fitted_variables(namespace: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The model's variables as JSON data where they are JSON-safe and not too
    large, else as a (shortened) repr."""
    out: dict[str, dict[str, Any]] = {}
    total, values = 0, 0
    for name in user_variables(namespace)[:VARIABLES_MOST]:
        value = namespace[name]
        if total >= _VARIABLES_TOTAL_LIMIT:  # the rest by type only: one frame holds all
            out[name] = {
                "repr": "<not returned: the variables are too large>",
                "type": type(value).__name__[:200],
            }
            continue
        try:
            json.dumps(value, allow_nan=False)  # JSON data, or not
            encoded = bridge.frame({"v": value})[bridge.HEADER.size :]
        except (TypeError, ValueError, RecursionError):
            encoded = None
        # Limits count bytes and values as the kernel does (see bridge.py).
        size = len(encoded) if encoded is not None else 0
        count = bridge.count_values(encoded) if encoded is not None else 0
        if (
            encoded is not None
            and size <= min(_VARIABLE_JSON_LIMIT, _VARIABLES_TOTAL_LIMIT - total)
            and values + count <= _VARIABLES_VALUE_LIMIT
        ):
            out[name], total, values = {"json": value}, total + size, values + count
            continue
        try:
            text = repr(value)
        except Exception as exc:  # noqa: BLE001 - a broken __repr__ is the model's
            text = f"<{type(value).__name__}: repr failed: {exc}>"
        if len(text) > 10_000:
            text = text[:10_000] + f"... [{len(text):,} characters; too large to return]"
        out[name], total = (
            {"repr": text, "type": type(value).__name__[:200]},
            total + wire_size(text),
        )
        values += 3
    return out


# -- batches -----------------------------------------------------------------------------
def listed_batch(name: str, args: tuple[Any, ...]) -> tuple[Any, ...]:
    """A batch's prompts (and contexts) as lists, so they can be split."""
    if name not in BATCH_NAMES:
        return args
    return tuple(
        list(a) if i < 2 and not isinstance(a, (str, bytes, dict)) and hasattr(a, "__iter__") else a
        for i, a in enumerate(args)
    )


# A part of a batch: its arguments and keyword arguments.
BatchPart = tuple[tuple[Any, ...], dict[str, Any]]


def batch_parts(name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[BatchPart] | None:
    """A batch too large for one frame as parts that fit, or None if it cannot be split
    (a single item too large, or more prompts than any run's budget: refused whole)."""
    prompts = args[0] if args else None
    if (
        name not in BATCH_NAMES
        or not isinstance(prompts, list)
        or not 2 <= len(prompts) <= bridge.MAX_VALUES // 2
    ):
        return None
    contexts = args[1] if len(args) > 1 else kwargs.get("contexts")
    room, size, start = bridge.MAX_FROM_SANDBOX * 3 // 4, 0, 0
    bounds: list[slice] = []
    for index, prompt in enumerate(prompts):
        item = wire_size(prompt) + (wire_size(contexts[index]) if isinstance(contexts, list) else 0)
        if item > room:
            return None
        if size + item > room:
            bounds.append(slice(start, index))
            start, size = index, 0
        size += item
    bounds.append(slice(start, None))
    halves: list[BatchPart] = []
    for part in bounds:
        part_args = [prompts[part], *args[1:]]
        part_kwargs = dict(kwargs)
        if len(args) > 1 and isinstance(args[1], list) and len(args[1]) == len(prompts):
            part_args[1] = args[1][part]
        elif isinstance(kwargs.get("contexts"), list) and len(kwargs["contexts"]) == len(prompts):
            part_kwargs["contexts"] = kwargs["contexts"][part]
        halves.append((tuple(part_args), part_kwargs))
    return halves


def joined(
    parts: list[concurrent.futures.Future[Any]],
) -> concurrent.futures.Future[list[Any]]:
    """One future for a batch sent in parts: their answers in order, or the first
    error; cancelling it cancels them all."""
    whole: concurrent.futures.Future[list[Any]] = concurrent.futures.Future()
    lock = threading.Lock()

    def settle(_: concurrent.futures.Future[Any]) -> None:
        with lock:
            if whole.done():
                return
            for part in parts:
                if part.done() and not part.cancelled() and part.exception() is not None:
                    whole.set_exception(part.exception())
                    return
            if not all(part.done() for part in parts):
                return
            if any(part.cancelled() for part in parts):
                whole.cancel()
                return
            whole.set_result([answer for part in parts for answer in part.result()])

    whole.add_done_callback(lambda done: done.cancelled() and [p.cancel() for p in parts])
    for part in parts:
        part.add_done_callback(settle)
    return whole
