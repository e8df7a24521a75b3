"""A local server's slots: calls past what it runs at once wait here, not at the server.

llama.cpp serves ``--parallel`` slots and queues the rest; a queued request gets no
token until a slot frees, so with more calls in flight than slots the stall watch took
the queued ones for stalled ones (64 prompts at 8 slots, ``timeout=30``: 16 lost, 80
retries, the server working all along). Where a server says how many requests it runs
at once (llama.cpp's ``total_slots`` at ``/props``, read by the window probe), calls to
it are held to that many: the rest wait on our side, counted as waiting in the progress
line, and a call's stall timer starts only once it is sent.

A server may still queue a call of ours behind other clients' requests (a notebook is
not always its only client). So before a call's first token, when its stall timer runs
out, the server is asked whether it is working (``server_busy``: llama.cpp, a slot
processing at ``/slots``; vLLM, requests running or waiting in ``/metrics``); while it
is, the wait is not a stall (see ``streaming``).

vLLM does not report its limit of running sequences (``--max-num-seqs``), nor Ollama its
``OLLAMA_NUM_PARALLEL``, at any endpoint they serve by default: calls to them are not
held (vLLM runs up to 256 at once by default; Ollama queues the rest).
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Awaitable, Callable
from types import TracebackType
from typing import TYPE_CHECKING

from .keys import sent_key
from .limiter import ConcurrencyLimiter
from .local_servers import PROBE_TIMEOUT, read_json, read_text, server_root
from .profiles import PROFILES

if TYPE_CHECKING:
    from .call import Call

BUSY_KEPT_S = 1.0  # a server's answer to "are you working?" serves every call this long


class ServerSlots:
    """The calls in flight to one server, held to its slots (None: it did
    not say how many it has), and its latest answer to "are you working?"."""

    def __init__(self, total: int | None):
        self.total = total
        self.limiter = ConcurrencyLimiter(lambda: self.total or 1 << 30)
        self.waiting = 0  # calls held back on our side
        self.busy: tuple[float, asyncio.Future[bool]] | None = None  # (asked at, answer)


class _Hold:
    """A slot of the server for one attempt: waits for one (within the call's deadline)
    and gives it back when the attempt ends, however it ends."""

    def __init__(self, slots: ServerSlots, deadline: float | None):
        self.slots, self.deadline = slots, deadline

    async def __aenter__(self) -> None:
        limiter = self.slots.limiter
        if limiter.has_free_slot():
            await limiter.acquire()  # at once
            return
        self.slots.waiting += 1
        try:
            if self.deadline is None:
                await limiter.acquire()
            else:
                await asyncio.wait_for(
                    limiter.acquire(), max(0.0, self.deadline - time.monotonic())
                )
        except asyncio.TimeoutError:
            raise TimeoutError(
                "the REPL step's time ran out while the call waited for a free slot of the server"
            ) from None
        finally:
            self.slots.waiting -= 1

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.slots.limiter.release()


class _NoHold:
    async def __aenter__(self) -> None:
        return None

    async def __aexit__(self, *exc: object) -> None:
        return None


_NO_HOLD = _NoHold()


def held(call: Call, api_key: str | None = None) -> _Hold | _NoHold:
    """What one attempt of ``call`` holds while it is sent: a slot of its server where
    the server said how many it has (else nothing). A streamed attempt's state is also
    told how to ask the server whether it is working (``server_busy``), with the key
    the call itself carries there (``api_key``: ``RLM.api_key``; ``keys.sent_key``)."""
    endpoint = call.endpoint
    at = PROFILES.known_at(endpoint, call.model)
    if (
        at is None
        or not at.server_is_local  # (its own endpoints are not asked of other hosts)
        or at.server_kind not in ("llama.cpp", "vllm")
        or not endpoint
    ):
        return _NO_HOLD
    slots = slots_for(endpoint, at.server_slots)
    if call.state is not None:
        key = sent_key(call.model, endpoint, api_key)
        call.state.server_busy = _asker(slots, endpoint, at.server_kind, key)
    if not slots.total:
        return _NO_HOLD
    return _Hold(slots, call.options.deadline)


def slots_for(endpoint: str, total: int | None) -> ServerSlots:
    """The slots of the server at ``endpoint`` on the running loop (shared by every
    model name it is asked by: llama.cpp serves one model, whatever the name)."""
    holds = PROFILES.slot_holds.setdefault(asyncio.get_running_loop(), {})
    slots = holds.get(endpoint)
    if slots is None:
        slots = holds[endpoint] = ServerSlots(total)
    slots.total = total  # (the server asked again may have other settings)
    return slots


def hold_message() -> str | None:
    """'56 waiting for the server's 8 slots' while calls wait for one, else None."""
    try:
        holds = PROFILES.slot_holds.get(asyncio.get_running_loop(), {})
    except RuntimeError:
        return None
    waiting = [slots for slots in holds.values() if slots.waiting]
    if not waiting:
        return None
    count = sum(slots.waiting for slots in waiting)
    total = sum(slots.total or 0 for slots in waiting)
    return f"{count} waiting for the server's {total} slots"


# -- is the server working? ----------------------------------------------------------------


def _asker(
    slots: ServerSlots, api_base: str, kind: str, api_key: str | None
) -> Callable[[], Awaitable[bool]]:
    def ask() -> Awaitable[bool]:
        return server_busy(slots, api_base, kind, api_key)

    return ask


async def server_busy(
    slots: ServerSlots, api_base: str, kind: str, api_key: str | None = None
) -> bool:
    """Whether the server reports work in progress (llama.cpp: a slot processing;
    vLLM: requests running or waiting). One question per server at a time, its answer
    kept ``BUSY_KEPT_S``: a hundred queued calls ask once."""
    known = slots.busy
    if known is None or (known[1].done() and time.monotonic() - known[0] > BUSY_KEPT_S):
        known = slots.busy = (
            time.monotonic(),
            asyncio.ensure_future(_ask_busy(api_base, kind, api_key)),
        )
    try:
        return await asyncio.shield(known[1])
    except asyncio.CancelledError:
        raise
    except Exception:  # noqa: BLE001 - a server that cannot say is not known to be busy
        return False


_VLLM_QUEUES = re.compile(
    r"^vllm:num_requests_(?:running|waiting)(?:\{[^}]*\})?\s+([0-9.eE+-]+)\s*$", re.M
)


async def _ask_busy(api_base: str, kind: str, api_key: str | None) -> bool:
    import aiohttp

    root = server_root(api_base)
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    timeout = aiohttp.ClientTimeout(total=PROBE_TIMEOUT)
    async with aiohttp.ClientSession(timeout=timeout, headers=headers) as session:
        if kind == "llama.cpp":
            listed = await read_json(session, root + "/slots")
            if isinstance(listed, list):
                return any(isinstance(s, dict) and s.get("is_processing") for s in listed)
            # /slots turned off (--no-slots): its metrics, if on (--metrics)
            text = await read_text(session, root + "/metrics")
            found = re.search(r"^llamacpp:requests_processing\s+([0-9.eE+-]+)", text or "", re.M)
            return bool(found and float(found.group(1)) > 0)
        text = await read_text(session, root + "/metrics")
        return any(float(n) > 0 for n in _VLLM_QUEUES.findall(text or ""))
