"""A minimal OpenAI-compatible chat server on 127.0.0.1, in a thread with its own event
loop, so a client on any loop (or a kernel in another process) reaches it over real
HTTP: the demo model's server, and the base of the tests' scripted server.

It serves ``/v1/chat/completions`` (plain JSON, or server-sent events when asked to
stream) and a provider's batch jobs (``batches.BatchJobsAPI``). A subclass decides what
is answered (``answer``) and may shape the rest: usage, cached tokens, finish reason,
headers, the pace of a stream.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import re
import threading
import time
from typing import TYPE_CHECKING, Any, TypeVar

from .batches import BatchJobsAPI

if TYPE_CHECKING:
    from aiohttp import web

_Server = TypeVar("_Server", bound="LocalChatServer")


class LocalChatServer:
    """A minimal OpenAI-compatible ``/v1/chat/completions`` server in a background
    thread with its own event loop. Subclasses implement ``answer``."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0):
        self.host, self.port = host, port
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._runner: web.AppRunner | None = None

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}/v1"

    @property
    def running(self) -> bool:
        return self._loop is not None

    async def answer(self, body: dict) -> str:
        raise NotImplementedError

    def start(self: _Server) -> _Server:
        ready = threading.Event()
        failure: list[BaseException] = []
        self._thread = threading.Thread(
            target=self._serve, args=(ready, failure), daemon=True, name=type(self).__name__
        )
        self._thread.start()
        if not ready.wait(10) or failure:
            raise RuntimeError(f"{type(self).__name__} did not start: {failure[:1]}")
        return self

    def stop(self) -> None:
        loop, self._loop = self._loop, None
        if loop is not None:
            # The runner and the thread were made before the loop was published.
            assert self._runner is not None and self._thread is not None
            asyncio.run_coroutine_threadsafe(self._runner.cleanup(), loop).result(5)
            loop.call_soon_threadsafe(loop.stop)
            self._thread.join(5)

    def _serve(self, ready: threading.Event, failure: list[BaseException]) -> None:
        from aiohttp import web

        loop = asyncio.new_event_loop()
        try:
            app = web.Application(client_max_size=64 * 1024 * 1024)
            self._add_routes(app.router)
            # handler_cancellation: a client that disconnects cancels its handler.
            self._runner = web.AppRunner(app, handler_cancellation=True, access_log=None)
            loop.run_until_complete(self._runner.setup())
            site = web.TCPSite(self._runner, self.host, self.port, backlog=1024)
            loop.run_until_complete(site.start())
            self.port = site._server.sockets[0].getsockname()[1]
        except BaseException as exc:  # noqa: BLE001 - reported by start()
            failure.append(exc)
            ready.set()
            return
        self._loop = loop
        ready.set()
        loop.run_forever()
        loop.close()

    def _add_routes(self, router) -> None:
        router.add_post("/v1/chat/completions", self._chat)
        router.add_post("/chat/completions", self._chat)
        self.batch_jobs.add_routes(router)

    @property
    def batch_jobs(self) -> BatchJobsAPI:
        """The Files + Batches API (a provider's batch jobs), answering through ``answer``."""
        if getattr(self, "_batch_jobs", None) is None:
            self._batch_jobs = BatchJobsAPI(self)
        return self._batch_jobs

    async def _chat(self, request):
        from aiohttp import web

        body = await request.json()
        try:
            text = await self.answer(body)
        except HTTPError as error:
            return web.json_response(
                {"error": {"message": error.message, "type": error.kind}},
                status=error.status,
                headers=error.headers,
            )
        usage = self.usage_for(body, text)
        if body.get("stream"):
            return await self._stream_chat(request, body, text, usage)
        return web.json_response(
            completion_json(body, text, usage, self), headers=self.response_headers(body)
        )

    async def _stream_chat(self, request, body: dict, text: str, usage: tuple[int, int]):
        """The answer as OpenAI's server-sent events: one chunk per word, ``chunk_delay``
        apart, and usage in a last chunk when the client asked for it."""
        from aiohttp import web

        response = web.StreamResponse(
            headers={"Content-Type": "text/event-stream", **(self.response_headers(body) or {})}
        )
        await response.prepare(request)
        head = {
            "id": "chatcmpl-stream",
            "object": "chat.completion.chunk",
            "created": int(time.time()),
            "model": body.get("model", "unknown"),
        }

        async def send(payload) -> None:
            data = payload if isinstance(payload, str) else json.dumps({**head, **payload})
            await response.write(f"data: {data}\n\n".encode())

        try:
            for index, piece in enumerate(split_tokens(text)):
                delay = self.chunk_delay(body, index)
                if delay:
                    await asyncio.sleep(delay)
                await send(
                    {
                        "choices": [
                            {
                                "index": 0,
                                "finish_reason": None,
                                "delta": {"role": "assistant", "content": piece},
                            }
                        ]
                    }
                )
            await send(
                {"choices": [{"index": 0, "delta": {}, "finish_reason": self.finish_reason(body)}]}
            )
            if (body.get("stream_options") or {}).get("include_usage") and self.stream_usage:
                await send({"choices": [], "usage": usage_json(body, usage, self)})
            await send("[DONE]")
            await response.write_eof()
        except ConnectionResetError:
            # The client went away (an interrupt, a cancelled batch): nothing to finish.
            # Raised on, aiohttp would log a traceback into the notebook's cell.
            pass
        return response

    # Streaming: seconds before each chunk, and whether usage is sent when asked for.
    stream_usage = True

    def chunk_delay(self, body: dict, index: int) -> float:
        return 0.0

    def cached_tokens(self, body: dict) -> int:
        """Prompt tokens a provider's automatic prompt cache would have served."""
        return 0

    def finish_reason(self, body: dict) -> str:
        """Why the answer ended: "stop", or "length" when max_tokens cut it."""
        return "stop"

    def response_headers(self, body: dict) -> dict[str, str] | None:
        """Extra headers of a successful answer (a test server adds rate-limit ones)."""
        return None

    def usage_for(self, body: dict, text: str) -> tuple[int, int]:
        """(prompt, completion) tokens: about four characters a token."""
        prompt = sum(len(m.get("content") or "") for m in body.get("messages", []))
        return max(1, prompt // 4), max(1, len(text) // 4)

    async def answer_json(self, body: dict) -> tuple[int, dict]:
        """(status, JSON body) of a request answered whole: what a batch job's output
        or error line holds. The batch API reaches the server through this alone."""
        try:
            text = await self.answer(body)
        except HTTPError as error:
            return error.status, {"error": {"message": error.message, "type": error.kind}}
        return 200, completion_json(body, text, self.usage_for(body, text), self)


class HTTPError(Exception):
    """Raised by ``answer``: the request is refused as a provider refuses it, with this
    status, OpenAI's error JSON (``message``, ``type``) and any extra headers."""

    def __init__(
        self,
        status: int,
        message: str,
        kind: str = "server_error",
        headers: dict[str, str] | None = None,
    ):
        super().__init__(message)
        self.status, self.message, self.kind = status, message, kind
        self.headers = headers


def split_tokens(text: str) -> list[str]:
    """Streaming pieces: each word with the whitespace after it (about a token each)."""
    return re.findall(r"\s+|\S+\s*", text) or [""]


def usage_json(body: dict, usage: tuple[int, int], server: LocalChatServer | None = None) -> dict:
    """OpenAI's ``usage`` object; the server, when given, adds its cached prompt tokens."""
    prompt_tokens, completion_tokens = usage
    data: dict[str, Any] = {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }
    cached = server.cached_tokens(body) if server is not None else 0
    if cached:
        data["prompt_tokens_details"] = {"cached_tokens": cached}
    return data


def completion_json(
    body: dict, text: str, usage: tuple[int, int], server: LocalChatServer | None = None
) -> dict:
    """An OpenAI chat completion holding ``text``; the server, when given, says why it
    finished and how many prompt tokens were cached."""
    return {
        "id": "chatcmpl-" + hashlib.sha1(text.encode()).hexdigest()[:12],
        "object": "chat.completion",
        "created": int(time.time()),
        "model": body.get("model", "unknown"),
        "choices": [
            {
                "index": 0,
                "finish_reason": server.finish_reason(body) if server is not None else "stop",
                "message": {"role": "assistant", "content": text},
            }
        ],
        "usage": usage_json(body, usage, server),
    }
