"""The wire transport: OpenAI-compatible chat completions sent straight over aiohttp.

litellm spends ~4 ms of the loop's CPU on every call (logging, cost machinery, response
objects), twenty times what the HTTP exchange itself costs; with a few hundred answers a
second that saturates the kernel's loop. For endpoints that speak OpenAI's chat API
as-is (``routes``), this module sends the request litellm would send and reads the
answer with a few dictionary lookups. Everything else (the gate, retries, the ledger, the
cache, redaction) stays in the client; errors are raised as classes with litellm's names,
status codes and headers (``errors``), so the client classifies and words them the same
way. Prices come from litellm's price map, read without importing litellm
(``price_map``); token counts, when a provider sends no usage, by litellm's tokenizer if
it is imported, else by the learned estimate.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

from ... import windows
from ...litellm_loader import imported_litellm
from ...messages import Messages
from ...pricing import cost_of_usage
from ...profiles import DEFAULT_CHARS_PER_TOKEN
from ...ratelimit import non_negative
from ...streaming import StallWatch, StreamState
from ..base import Answer, Request
from . import sessions, sse
from .errors import ResponseHeaders, connection_error, error_for, redirect_error
from .parsing import completion_parts, finish_reason_of
from .routes import Route

# Prompts counted off the loop above this many characters (usage missing).
_LARGE_CHARS = 50_000


class WireTransport:
    """Sends one route's requests (see ``base.Transport``)."""

    name = "wire"

    def __init__(self, route: Route, litellm: Any):
        self.route = route
        self._litellm = litellm  # for token counts when a provider sends no usage

    def body(self, request: Request) -> tuple[dict[str, Any], dict[str, str]]:
        """The JSON body and the headers of ``request`` (our request dict)."""
        route = self.route
        body = {"model": route.sent_model}
        headers = route.headers
        for name, value in request.items():
            if name in ("model", "timeout", "max_retries", "api_base", "api_key"):
                continue
            if name == "extra_headers":
                headers = {**headers, **(value or {})}
            elif name == "extra_body":
                body.update(value or {})
            else:
                body[name] = value
        return body, headers

    async def complete(self, request: Request, messages: Messages | None = None) -> Answer:
        import aiohttp

        body, headers = self.body(request)
        route = self.route
        try:
            reply = await self._post(body, headers)
            try:
                raw = await reply.read()
            finally:
                reply.release()
            status, received = reply.status, reply.headers
        except aiohttp.ClientError as exc:
            raise connection_error(exc, route.api_base) from exc
        if status >= 400:
            raise error_for(status, raw, received, route.api_base)
        if status >= 300:
            raise redirect_error(status, received, route.api_base)
        text, finish, usage = completion_parts(raw, received, route.api_base)
        messages = messages or request.get("messages")
        if not usage:
            return await self._counted_answer(text, finish, received, messages)
        return self._answer(text, finish, usage, received, messages)

    async def stream(
        self,
        request: Request,
        state: StreamState,
        *,
        stall_timeout: float,
        deadline: float | None,
        messages: Messages | None = None,
    ) -> Answer:
        """One pass: the request sent, its bytes read into ``state`` as events under the
        stall watch (``sse.read``), the connection let go, the answer priced."""
        body, headers = self.body(request)
        body["stream"], body["stream_options"] = True, {"include_usage": True}
        api_base = self.route.api_base
        reply, done = None, False
        try:
            async with StallWatch(stall_timeout, deadline, state) as watch:
                reply = await self._opened(body, headers)
                received = reply.headers
                watch.opened()
                done = await sse.read(reply, state, watch.touch, api_base)
        finally:
            if reply is not None:
                sse.let_go(reply, done)
        messages = messages or request.get("messages")
        finish = state.finish_reason
        if not state.usage:
            return await self._counted_answer(state.text, finish, received, messages)
        return self._answer(state.text, finish, state.usage, received, messages)

    def partial(self, state: StreamState | None, messages: Messages | None) -> Answer | None:
        """What a cut-off stream received, priced (it is billed all the same)."""
        if state is None or not state.received:
            return None
        return self._answer(state.text, state.finish_reason, state.usage, None, messages)

    async def _opened(self, body: dict[str, Any], headers: dict[str, str]) -> Any:
        """The reply to a streamed request, its status read: an error or a redirect is
        raised, with its body read and its connection released."""
        import aiohttp

        api_base = self.route.api_base
        try:
            reply = await self._post(body, headers)
        except aiohttp.ClientError as exc:
            raise connection_error(exc, api_base) from exc
        status = reply.status
        if status >= 300:
            try:
                raw = await reply.read()
            finally:
                reply.release()
            if status < 400:
                raise redirect_error(status, reply.headers, api_base)
            raise error_for(status, raw, reply.headers, api_base)
        return reply

    async def _post(self, body: dict[str, Any], headers: dict[str, str]) -> Any:
        """The reply (its status and headers read) to ``body``.

        A server closes a kept-alive connection between requests, when it likes, and
        says so only by closing it: a request that meets such a close (the connection
        carried requests before, and it failed before any byte of an answer: "Can not
        write request body", "Server disconnected", a reset) was not taken, and goes
        again on a new connection, not as a retry (RFC 9112 9.3.1): once an attempt,
        a later attempt of the call included (it may meet another). A new connection's
        failure is the server's own: a retry, as before."""
        import aiohttp

        route = self.route
        sessions.forget_connection()
        try:
            return await sessions.session().post(
                route.url, json=body, headers=headers, proxy=route.proxy, allow_redirects=False
            )
        except aiohttp.ClientConnectorError:
            raise  # no connection was made: nothing to send again
        except (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError, ConnectionResetError):
            if not sessions.reused_connection():
                raise
        return await sessions.fresh_session().post(
            route.url, json=body, headers=headers, proxy=route.proxy, allow_redirects=False
        )

    async def _counted_answer(
        self,
        text: str,
        finish_reason: Any,
        headers: ResponseHeaders | None,
        messages: Messages | None,
    ) -> Answer:
        """The answer of a provider that sent no usage: its tokens counted as litellm
        counts them, a large prompt in a thread (the loop stays free)."""
        if _characters(messages) > _LARGE_CHARS:
            counts = await asyncio.to_thread(self._count, messages, text)
        else:
            counts = self._count(messages, text)
        return self._answer(text, finish_reason, None, headers, messages, counts)

    def _answer(
        self,
        text: str,
        finish_reason: Any,
        usage: Mapping[str, Any] | None,
        headers: ResponseHeaders | None,
        messages: Messages | None,
        counts: tuple[int, int] | None = None,
    ) -> Answer:
        if usage:
            get = usage.get
            details = get("prompt_tokens_details") or {}
            input_tokens = int(get("prompt_tokens") or 0)
            output_tokens = int(get("completion_tokens") or 0)
            read = int(details.get("cached_tokens") or get("cache_read_input_tokens") or 0)
            written = int(
                get("cache_creation_input_tokens") or details.get("cache_creation_tokens") or 0
            )
        else:  # counted as litellm does when a provider leaves usage out
            input_tokens, output_tokens = counts or self._counts_on_loop(messages, text)
            read = written = 0
        route = self.route
        cost = cost_of_usage(
            self._litellm,
            route.price_names,
            input_tokens,
            output_tokens,
            read,
            written,
            headers,
        )
        if cost is None and usage:
            # A LiteLLM Proxy puts its price of a streamed answer in the usage.
            cost = non_negative(usage.get("cost"))
        return Answer(
            text,
            finish_reason_of(finish_reason),
            input_tokens,
            output_tokens,
            read,
            written,
            cost,
            headers,
        )

    def _counts_on_loop(self, messages: Messages | None, text: str) -> tuple[int, int]:
        """Counts for a cut-off answer (``partial``, which cannot wait for a thread):
        litellm's for a small prompt, the characters' estimate for a large one."""
        if _characters(messages) <= _LARGE_CHARS:
            return self._count(messages, text)
        model = self.route.model
        return (
            windows.estimate_tokens(messages or [], model),
            round(len(text) / windows.chars_per_token(model)),
        )

    def _count(self, messages: Messages | None, text: str) -> tuple[int, int]:
        litellm, model = self._litellm or imported_litellm(), self.route.model
        # Not imported (this endpoint needs none), or this model's own usage reports have
        # taught its characters per token: that beats litellm's tokenizer, which counts
        # an unknown model's text as OpenAI's (27% short of Gemma's, on log text).
        if litellm is None or windows.learned_ratio(model):
            return (
                max(1, windows.estimate_tokens(messages or [], model)),
                round(len(text) / windows.chars_per_token(model)),
            )
        try:
            prompt = litellm.token_counter(model=model, messages=messages or [])
            output = litellm.token_counter(model=model, text=text) if text else 0
            return int(prompt), int(output)
        except Exception:  # noqa: BLE001 - no tokenizer: the usual characters a token
            return (
                max(1, int(_characters(messages) / DEFAULT_CHARS_PER_TOKEN)),
                int(len(text) / DEFAULT_CHARS_PER_TOKEN),
            )


def _characters(messages: Messages | None) -> int:
    return sum(
        len(m["content"])
        for m in messages or ()
        if isinstance(m, dict) and isinstance(m.get("content"), str)
    )
