"""The wire between the kernel and a sandbox process: length-prefixed frames.

A frame is a 9-byte header (one kind byte, an 8-byte big-endian length) and a body.
Everything the sandbox sends is a JSON object and at most ``MAX_FROM_SANDBOX`` bytes:
the kernel never unpickles what the sandbox sends, since that would hand the model's
code the kernel. Only the kernel sends a pickle, once per sandbox: the context.

Standard library only: the sandbox worker imports this.
"""

from __future__ import annotations

import json
import socket
import struct

HEADER = struct.Struct(">cQ")
JSON, PICKLE = b"J", b"P"
# Big enough for a step's output or a FINAL_VAR answer; a larger frame is refused
# before a byte of its body is read.
MAX_FROM_SANDBOX = 128 * 2**20


class BridgeError(Exception):
    """The other side sent something the protocol does not allow."""


def frame(message: dict) -> bytes:
    text = json.dumps(message, ensure_ascii=False, default=_plain)
    try:
        body = text.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate (model code may print one): escape it
        body = json.dumps(message, default=_plain).encode("ascii")
    return HEADER.pack(JSON, len(body)) + body


def _plain(value):
    """What a helper argument that JSON cannot carry becomes: an iterable (a tuple, a
    generator, a set) a list, as ``list(prompts)`` would make it; anything else its str."""
    if not isinstance(value, (str, bytes, dict)):
        try:
            return list(iter(value))
        except TypeError:
            pass
    return str(value)


def pickle_frame_header(length: int) -> bytes:
    return HEADER.pack(PICKLE, length)


def parse_header(header: bytes, limit: int | None = MAX_FROM_SANDBOX,
                 kinds: tuple[bytes, ...] = (JSON,)) -> tuple[bytes, int]:
    kind, length = HEADER.unpack(header)
    if kind not in kinds:
        raise BridgeError(f"unexpected frame kind {kind!r}")
    if limit is not None and length > limit:
        raise BridgeError(f"a {length:,}-byte message, over the {limit:,}-byte limit")
    return kind, length


def parse_json(body: bytes) -> dict:
    try:
        message = json.loads(body.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise BridgeError(f"a message that is not JSON ({exc})") from None
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
