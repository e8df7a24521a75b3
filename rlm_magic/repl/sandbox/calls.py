"""The helper calls a sandbox makes (``llm_query`` & co.), served on the kernel's
loop: each a task whose answer, error or stop goes back over the bridge.

What the sandbox sends is checked here before it costs anything: a malformed call
breaks the protocol; a call of a stopped step is refused; a batch larger than the
run's sub-calls left is cut before it is expanded; calls that would hold too many
prompts in the kernel's memory at once are refused, not queued. What goes back is
bounded too: an error quotes at most an excerpt, and a large answer is framed off the
loop and sent in parts, each once the sandbox has read the one before.
"""

from __future__ import annotations

import asyncio
from typing import Any

from .. import bridge
from ..base import Helpers, SubCallBudget
from ..bridge import Message
from ..helpers import BATCH_NAMES
from .process import SandboxProcess

_HELD_LIMIT = 64 * 2**20  # helper calls' messages the kernel holds at once, at most
MAX_REPLY = 16 * 2**20  # one frame of a reply, at most
PART_CHARS = 2**20  # a larger answer is sent in parts of about this
_FRAMED_ON_LOOP = 64 * 2**10  # a larger answer is framed in a thread (400 at once stalled it)
MAX_ERROR_CHARS = 2_000  # of an error's text sent back


class HelperCalls:
    """The calls in flight for one REPL, and the helpers that serve them."""

    def __init__(
        self,
        helpers: Helpers,
        loop: asyncio.AbstractEventLoop,
        budget: SubCallBudget | None,
    ):
        self.helpers = helpers
        self.loop = loop
        # A batch larger than the run's sub-calls left is refused before it is expanded.
        self.budget = budget
        self.tasks: set[asyncio.Task[Any]] = set()
        self.by_id: dict[Any, asyncio.Task[Any]] = {}  # by the sandbox's call id
        self.held = 0  # bytes of the calls being served

    def serve(self, sandbox: SandboxProcess, message: Message, step: int | None) -> None:
        """Serve a call ``message`` the sandbox sent while ``step`` runs (None: none
        runs, or the REPL is closed)."""
        call_id, name = message.get("id"), message.get("name")
        args, kwargs = message.get("args"), message.get("kwargs")
        if not (
            isinstance(call_id, int)
            and name in self.helpers
            and isinstance(args, list)
            and isinstance(kwargs, dict)
        ):
            raise bridge.BridgeError("a malformed helper call")
        if step is None or message.get("step") != step:
            # A stopped step (or a thread outliving it) sends nothing more to a model.
            sandbox.send({"op": "result", "id": call_id, "stopped": True})
            return
        args, kwargs, refused = self._within_budget(name, args, kwargs)
        size = sandbox.frame_size
        if self.held + size > _HELD_LIMIT:
            # Calls wait for a free slot with their prompts in the kernel's memory: so
            # many that they would hold more than this are refused, not queued.
            sandbox.send(
                {
                    "op": "result",
                    "id": call_id,
                    "error": (
                        f"RuntimeError: the kernel already holds {self.held / 2**20:.0f} MB of "
                        f"prompts waiting to be sent (at most {_HELD_LIMIT // 2**20} MB): wait "
                        "for answers before sending more"
                    ),
                }
            )
            return
        try:
            coroutine = self.helpers[name](*args, **kwargs)
        except TypeError as exc:  # wrong arguments: raised in the model's code, as in-process
            sandbox.send(
                {"op": "result", "id": call_id, "error": _excerpt(str(exc)), "type": "TypeError"}
            )
            return
        task = self.loop.create_task(coroutine)
        self.tasks.add(task)
        self.by_id[call_id] = task
        self.held += size

        def answer(task: asyncio.Task[Any]) -> None:
            self.tasks.discard(task)
            self.by_id.pop(call_id, None)
            self.held -= size
            if task.cancelled():
                sandbox.send({"op": "result", "id": call_id, "stopped": True})
            elif task.exception() is not None:
                error = task.exception()
                text = f"{type(error).__name__}: {error}"
                sandbox.send({"op": "result", "id": call_id, "error": _excerpt(text)})
            else:
                message = {"op": "result", "id": call_id, "value": task.result()}
                if refused:
                    message["refused"] = refused
                self._reply(sandbox, message)

        task.add_done_callback(answer)

    def _reply(self, sandbox: SandboxProcess, message: Message) -> None:
        """Send a call's answer: a large one (a batch's answers can be tens of MB of
        JSON) framed in a thread, in parts the worker joins, each sent once the one
        before has left, so the kernel never holds more than a part of it framed."""
        try:
            small = _rough_size(message["value"]) < _FRAMED_ON_LOOP
        except RecursionError:
            small = False
        if small:
            self._send_framed(sandbox, message["id"], bridge.frame(message))
            return
        sending = self.loop.create_task(self._send_in_parts(sandbox, message))
        self.tasks.add(sending)  # a stopped step's reply is not sent on
        sending.add_done_callback(self.tasks.discard)

    async def _send_in_parts(self, sandbox: SandboxProcess, message: Message) -> None:
        call_id = message["id"]
        kind, parts = _split(message["value"])
        try:
            for index, part in enumerate(parts):
                last = index == len(parts) - 1
                piece = (
                    {**message, "value": part, "joined": kind}
                    if last
                    else {"op": "result_part", "id": call_id, "value": part}
                )
                data = await asyncio.to_thread(bridge.frame, piece)
                if not self._send_framed(sandbox, call_id, data) or last:
                    return
                await sandbox.drained()
        except (ValueError, RecursionError) as exc:  # nested past what JSON writes
            self._send_framed(
                sandbox, call_id, _error_frame(call_id, f"{type(exc).__name__}: {exc}")
            )

    def _send_framed(self, sandbox: SandboxProcess, call_id: Any, data: bytes) -> bool:
        """Send a framed reply, or an error in its place if it is over ``MAX_REPLY``
        (one answer that large); whether it went."""
        if sandbox.dead:
            return False
        if len(data) > MAX_REPLY:
            sandbox.write(
                _error_frame(
                    call_id,
                    f"RuntimeError: an answer of {len(data) / 2**20:.0f} MB as sent, over the "
                    f"{MAX_REPLY // 2**20} MB one answer may hold: ask for a shorter one",
                )
            )
            return False
        sandbox.write(data)
        return True

    def cancel(self, call_id: Any) -> None:
        """Model code stopped waiting for this call (the sandbox said so)."""
        task = self.by_id.get(call_id)
        if task is not None:
            task.cancel()

    def cancel_all(self) -> None:
        for task in list(self.tasks):
            task.cancel()

    def _within_budget(
        self, name: str, args: list[Any], kwargs: dict[str, Any]
    ) -> tuple[list[Any], dict[str, Any], dict[str, Any] | None]:
        """A batch with more prompts than the run has sub-calls left goes to the helper
        cut to what is left; the rest are refused here, before the kernel expands them
        (into tasks, or error strings sent back one by one). The worker appends one
        error string per refused prompt, so the model sees what in-process code sees."""
        budget = self.budget
        if name not in BATCH_NAMES or budget is None:
            return args, kwargs, None
        key = "prompts" if not args else None
        prompts = kwargs.get("prompts") if key else args[0]
        if not isinstance(prompts, list):
            return args, kwargs, None
        left = max(budget.sub_calls_left(), 0)
        if len(prompts) <= left:
            return args, kwargs, None
        args, kwargs = list(args), dict(kwargs)
        if key:
            kwargs["prompts"] = prompts[:left]
        else:
            args[0] = prompts[:left]
        # rlm_query_batch's contexts, given by position or by name
        if len(args) > 1 and isinstance(args[1], list):
            args[1] = args[1][:left]
        if isinstance(kwargs.get("contexts"), list):
            kwargs["contexts"] = kwargs["contexts"][:left]
        return (
            args,
            kwargs,
            {
                "count": len(prompts) - left,
                "error": (
                    f"Error: max_sub_calls={budget.max_sub_calls} reached for this run; "
                    "no request was sent"
                ),
            },
        )


def _excerpt(text: str) -> str:
    """An error's text as sent back: one that quotes what the sandbox sent (a schema,
    a prompt) whole, once per prompt of a batch, made replies of hundreds of MB."""
    if len(text) <= MAX_ERROR_CHARS:
        return text
    return f"{text[: MAX_ERROR_CHARS - 40]}… ({len(text):,} characters in all)"


def _rough_size(value: Any) -> int:
    """About how many characters ``value`` takes as JSON (its strings' lengths), quickly:
    a helper's answer is text, a list of texts or a typed answer's JSON data."""
    if isinstance(value, str):
        return len(value)
    if isinstance(value, (list, tuple)):
        return sum(_rough_size(item) for item in value) + len(value)
    if isinstance(value, dict):
        return sum(_rough_size(k) + _rough_size(v) for k, v in value.items()) + len(value)
    return 16


def _split(value: Any) -> tuple[str, list[Any]]:
    """A large answer in parts of about ``PART_CHARS``, and how the worker joins them:
    a text's slices ("text"), a list's runs of items ("list"); anything else whole."""
    if isinstance(value, str):
        slices = [value[at : at + PART_CHARS] for at in range(0, len(value), PART_CHARS)]
        return "text", slices or [""]
    if not isinstance(value, list):
        return "whole", [value]
    parts: list[list[Any]] = [[]]
    size = 0
    for item in value:
        item_size = _rough_size(item)
        if parts[-1] and size + item_size > PART_CHARS:
            parts.append([])
            size = 0
        parts[-1].append(item)
        size += item_size
    return "list", parts


def _error_frame(call_id: Any, text: str) -> bytes:
    return bridge.frame({"op": "result", "id": call_id, "error": _excerpt(text)})
