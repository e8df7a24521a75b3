"""The wire between the kernel and a sandbox process: length-prefixed frames.

A frame is a 9-byte header (one kind byte, an 8-byte big-endian length) and a body.
Everything the sandbox sends is a JSON object of at most ``MAX_FROM_SANDBOX`` bytes and
``MAX_VALUES`` JSON values, both checked before it is decoded: the kernel never
unpickles what the sandbox sends (that would hand the model's code the kernel), and a
frame cannot make it hold much more than its own size (a list of 10 million empty
objects is 30 MB sent and would be 700 MB decoded). Only the kernel sends a pickle,
once per sandbox: the context. A session's variables from its last question cross as
a third kind, plain data that the next sandbox loads with a restricted unpickler
(``carried.py``); the kernel only passes those bytes on.

Standard library only: the sandbox worker imports this.
"""

from __future__ import annotations

import json
import socket
import struct
from collections.abc import Callable
from typing import Any

# A message as it crosses: a JSON object whose "op" names it.
Message = dict[str, Any]

HEADER = struct.Struct(">cQ")
JSON, PICKLE, DATA = b"J", b"P", b"D"
# The kernel's interrupt, sent in band where signals cannot reach the sandbox (a
# container's worker, Deno's reader thread): a header with no body, never passed on.
INTERRUPT_KIND = b"I"
INTERRUPT = HEADER.pack(INTERRUPT_KIND, 0)
# Big enough for a step's output, a FINAL_VAR answer or a batch of prompts; a larger
# frame is refused before a byte of its body is read.
MAX_FROM_SANDBOX = 8 * 2**20
# Values (strings, numbers, lists, objects) in one frame: each costs the kernel up to
# about 70 bytes decoded, so this bounds a frame's decoded size near 7 MB + its text.
MAX_VALUES = 100_000


class BridgeError(Exception):
    """The other side sent something the protocol does not allow."""


def frame(message: Message) -> bytes:
    body = _dumps(message, json.encoder.encode_basestring_ascii).encode("ascii")
    return HEADER.pack(JSON, len(body)) + body


def _dumps(message: Message, encode_string: Callable[[str], str]) -> str:
    """ASCII JSON whose strings hold no literal quote, comma or opening bracket (they
    are written as \\u escapes), so ``count_values`` counts its values exactly."""

    def text(value: str) -> str:
        inner: str = encode_string(value)[1:-1]
        # Every quote left in `inner` follows the backslash that escapes it.
        return (
            '"'
            + inner.replace('"', "u0022")
            .replace(",", "\\u002c")
            .replace("[", "\\u005b")
            .replace("{", "\\u007b")
            + '"'
        )

    # json's own encoder factories, which typeshed does not declare.
    encoders: Any = json.encoder
    make = encoders.c_make_encoder or encoders._make_iterencode
    if encoders.c_make_encoder is not None:
        encoder = make({}, _plain, text, None, ":", ",", False, False, True)
    else:  # a Python without the _json accelerator
        encoder = make({}, _plain, text, None, float.__repr__, ":", ",", False, False, True)
    return "".join(encoder(message, 0))


def _plain(value: Any) -> list[Any] | str:
    """What a helper argument that JSON cannot carry becomes: an iterable (a tuple, a
    generator, a set) a list, as ``list(prompts)`` would make it; anything else its str."""
    if not isinstance(value, (str, bytes, dict)):
        try:
            return list(iter(value))
        except TypeError:
            pass
    return str(value)


def pickle_frame_header(length: int, kind: bytes = PICKLE) -> bytes:
    return HEADER.pack(kind, length)


def parse_header(
    header: bytes | bytearray,
    limit: int | None = MAX_FROM_SANDBOX,
    kinds: tuple[bytes, ...] = (JSON,),
) -> tuple[bytes, int]:
    kind, length = HEADER.unpack(header)
    if kind not in kinds:
        raise BridgeError(f"unexpected frame kind {kind!r}")
    if limit is not None and length > limit:
        raise BridgeError(f"a {length:,}-byte message, over the {limit:,}-byte limit")
    return kind, length


def count_values(body: bytes) -> int:
    """An upper bound on the JSON values in ``body``, counted without decoding it: every
    value but the first follows a comma or an opening bracket, or is a string. ``frame``
    escapes these characters inside strings, so for its frames the count is exact and a
    long text with many commas is one value; a hand-made frame can only count high."""
    return body.count(b",") + body.count(b"[") + body.count(b"{") + body.count(b'"') // 2 + 1


class BodyCheck:
    """``check_body`` a piece at a time, as a large frame arrives: the counting is
    spread over the event loop's turns instead of stalling one."""

    def __init__(self) -> None:
        self.values, self.quotes = 1, 0

    def add(self, piece: bytes) -> None:
        if not piece.isascii():
            raise BridgeError("a message that is not ASCII JSON")
        self.values += piece.count(b",") + piece.count(b"[") + piece.count(b"{")
        self.quotes += piece.count(b'"')
        if self.values + self.quotes // 2 > MAX_VALUES:
            raise BridgeError(f"a message of more than {MAX_VALUES:,} JSON values")


def oversize(body: bytes) -> str | None:
    """Why the kernel would refuse this frame body, or None."""
    if len(body) > MAX_FROM_SANDBOX:
        return (
            f"a {len(body):,}-byte message, over the {MAX_FROM_SANDBOX:,}-byte limit "
            "of the sandbox's bridge"
        )
    values = count_values(body)
    if values > MAX_VALUES:
        return f"a message of {values:,} JSON values, over the bridge's {MAX_VALUES:,}"
    return None


def check_body(body: bytes) -> None:
    """Refuse a frame body the kernel will not decode: too many values, or not ASCII
    (``frame`` escapes all else, and decoded ASCII takes no more room than sent)."""
    why = oversize(body)
    if why is None and not body.isascii():
        why = "a message that is not ASCII JSON"
    if why is not None:
        raise BridgeError(why)


def parse_json(body: bytes | str) -> Message:
    try:
        message = json.loads(body if isinstance(body, str) else body.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise BridgeError(f"a message that is not JSON ({exc})") from None
    except RecursionError:  # within MAX_VALUES, 40,000 '[' still are
        raise BridgeError("a message nested too deeply to decode") from None
    if not isinstance(message, dict) or not isinstance(message.get("op"), str):
        raise BridgeError("a message without an 'op'")
    return message


def read_exactly(sock: socket.socket, size: int) -> bytearray:
    """Blocking read of ``size`` bytes (the sandbox side); EOFError when the peer left."""
    data = bytearray(size)
    view, got = memoryview(data), 0
    while got < size:
        count = sock.recv_into(view[got:])
        if not count:
            raise EOFError("the bridge closed")
        got += count
    return data
