"""The test server as llama.cpp or vLLM are, recording where keys go: it takes any key,
or none, unless started with one (``required_key``: ``--api-key``), and records the
Authorization header of every request, chat and what a local server is asked."""

from __future__ import annotations

from aiohttp import web

from rlm_magic import RLM

from .llm_server import FakeLLMServer

_RECORDED = web.RequestKey("recorded", bool)
# Where a key or an endpoint of the user's may sit in the environment.
KEY_VARIABLES = (
    "OPENAI_API_KEY",
    "OPENAI_BASE_URL",
    "OPENAI_API_BASE",
    "HOSTED_VLLM_API_KEY",
    "HOSTED_VLLM_API_BASE",
    "LITELLM_PROXY_API_KEY",
    "LITELLM_PROXY_API_BASE",
    "ANTHROPIC_API_KEY",
    "ANTHROPIC_AUTH_TOKEN",
    "ANTHROPIC_API_BASE",
    "ANTHROPIC_BASE_URL",
)


class RecordingServer(FakeLLMServer):
    """The test server, recording the Authorization header of every request (chat, and
    what a local server is asked: /props, /slots, /metrics, /tokenize, /v1/models...).
    Started with a key (``required_key``) it refuses any other, with ``refusal``."""

    def __init__(self) -> None:
        super().__init__()
        self.required_key: str | None = None
        self.refusal = 401
        self.arrived: list[tuple[str, str | None]] = []

    def _record(self, request) -> None:
        if _RECORDED not in request:  # (a handler may hand a request to another)
            request[_RECORDED] = True
            self.arrived.append((request.path, request.headers.get("Authorization")))

    def chat_authorizations(self) -> list[str | None]:
        return [sent for path, sent in self.arrived if path.endswith("/chat/completions")]

    def probe_authorizations(self) -> set[str | None]:
        return {sent for path, sent in self.arrived if not path.endswith("/chat/completions")}

    async def _chat(self, request):
        self._record(request)
        sent = request.headers.get("Authorization")
        if self.required_key is not None and sent != f"Bearer {self.required_key}":
            kind = "authentication_error" if self.refusal == 401 else "permission_error"
            return web.json_response(
                {"error": {"code": self.refusal, "message": "Invalid API Key", "type": kind}},
                status=self.refusal,
            )
        return await super()._chat(request)

    async def _window_answer(self, request):
        self._record(request)
        return await super()._window_answer(request)

    async def _slot_props(self, request):
        self._record(request)
        return await super()._slot_props(request)

    async def _slot_list(self, request):
        self._record(request)
        return await super()._slot_list(request)

    async def _slot_metrics(self, request):
        self._record(request)
        return await super()._slot_metrics(request)

    async def _tokenize(self, request):
        self._record(request)
        return await super()._tokenize(request)


def rlm_at(server, **settings) -> RLM:
    """An RLM whose models are openai/ models at ``server``, with no key unless given."""
    return RLM(
        **{
            "model": "openai/root-model",
            "sub_model": "openai/sub-model",
            "api_base": server.base_url,
            "retry_backoff": 0.01,
            "progress": False,
            "timeout": 10,
            **settings,
        }
    )
