"""The helper calls a sandbox makes (``llm_query`` & co.), served on the kernel's
loop: each a task whose answer, error or stop goes back over the bridge.

What the sandbox sends is checked here before it costs anything: a malformed call
breaks the protocol; a call of a stopped step is refused; a batch larger than the
run's sub-calls left is cut before it is expanded; calls that would hold too many
prompts in the kernel's memory at once are refused, not queued.
"""

from __future__ import annotations

import asyncio
from typing import Any

from .. import bridge
from ..base import Helpers, SubCallBudget
from ..helpers import BATCH_NAMES
from .process import SandboxProcess

_HELD_LIMIT = 64 * 2**20  # helper calls' messages the kernel holds at once, at most


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
        self.tasks: set[asyncio.Task] = set()
        self.by_id: dict[Any, asyncio.Task] = {}  # by the sandbox's call id
        self.held = 0  # bytes of the calls being served

    def serve(self, sandbox: SandboxProcess, message: dict, step: int | None) -> None:
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
            sandbox.send({"op": "result", "id": call_id, "error": str(exc), "type": "TypeError"})
            return
        task = self.loop.create_task(coroutine)
        self.tasks.add(task)
        self.by_id[call_id] = task
        self.held += size

        def answer(task: asyncio.Task) -> None:
            self.tasks.discard(task)
            self.by_id.pop(call_id, None)
            self.held -= size
            if task.cancelled():
                sandbox.send({"op": "result", "id": call_id, "stopped": True})
            elif task.exception() is not None:
                error = task.exception()
                sandbox.send(
                    {"op": "result", "id": call_id, "error": f"{type(error).__name__}: {error}"}
                )
            else:
                sandbox.send(
                    {
                        "op": "result",
                        "id": call_id,
                        "value": task.result(),
                        **({"refused": refused} if refused else {}),
                    }
                )

        task.add_done_callback(answer)

    def cancel(self, call_id: Any) -> None:
        """Model code stopped waiting for this call (the sandbox said so)."""
        task = self.by_id.get(call_id)
        if task is not None:
            task.cancel()

    def cancel_all(self) -> None:
        for task in list(self.tasks):
            task.cancel()

    def _within_budget(
        self, name: str, args: list, kwargs: dict
    ) -> tuple[list, dict, dict[str, Any] | None]:
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
        for where, index in ((args, 1), (kwargs, "contexts")):  # rlm_query_batch's
            if isinstance(where, list) and len(where) > 1 and isinstance(where[1], list):
                where[1] = where[1][:left]
            elif isinstance(where, dict) and isinstance(where.get(index), list):
                where[index] = where[index][:left]
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
