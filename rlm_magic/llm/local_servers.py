"""The context window a local server really runs a model with, asked of the server.

litellm's model map knows cloud models; a local server runs whatever it was started
with (llama.cpp's ``--ctx-size`` split over its slots, vLLM's ``--max-model-len``,
Ollama's ``num_ctx``), and each says so at an endpoint of its own:

- llama.cpp: ``GET /props`` (``default_generation_settings.n_ctx``, a slot's context),
  else ``GET /slots`` (each slot's ``n_ctx``);
- vLLM: ``GET /v1/models`` (``max_model_len`` of the model);
- Ollama: ``GET /api/ps`` (``context_length`` of a loaded model), else
  ``POST /api/show`` (a ``num_ctx`` parameter), else Ollama's default of 4,096 tokens
  (at most the model's own ``context_length``).

A server is asked once per (api_base, model), on the running loop, all endpoints at
once and for at most ``PROBE_TIMEOUT`` seconds: a server that is down or is none of
these costs the first call that long at most, and is not asked again. Only models of
OpenAI-compatible and Ollama providers at a configured ``api_base`` are asked.
"""

from __future__ import annotations

import asyncio
import re
from typing import Any

PROBE_TIMEOUT = 2.0
OLLAMA_DEFAULT_NUM_CTX = 4096  # what Ollama runs a model with unless told otherwise

# litellm's provider prefixes: the server knows the model by the rest of the name.
_PREFIX = re.compile(r"^(?:openai|hosted_vllm|ollama|ollama_chat|llamafile|lm_studio|"
                     r"text-completion-openai|custom_openai)/")

_ASKED: dict[tuple[str, str], "asyncio.Future[int | None]"] = {}
_FOUND: dict[tuple[str, str], int | None] = {}


def reported_window(api_base: str | None, model: str) -> int | None:
    """The window the server at ``api_base`` reported for ``model``, if it did."""
    if not api_base:
        return None
    return _FOUND.get((api_base, model))


def asked(api_base: str | None, model: str) -> bool:
    return not may_ask(api_base, model) or (api_base, model) in _FOUND


def may_ask(api_base: str | None, model: str) -> bool:
    """Only an OpenAI-compatible or Ollama model at an api_base of the user's is asked
    (not Azure's, Anthropic's or OpenAI's own endpoints: their windows are known)."""
    return bool(api_base) and bool(_PREFIX.match(model)) and \
        "api.openai.com" not in (api_base or "")


async def ask(api_base: str | None, model: str, api_key: str | None = None) -> int | None:
    """The server's window for ``model`` (asked once; None if it does not say)."""
    if not may_ask(api_base, model):
        return None
    key = (api_base, model)
    if key in _FOUND:
        return _FOUND[key]
    pending = _ASKED.get(key)
    if pending is None or pending.get_loop() is not asyncio.get_running_loop():
        pending = _ASKED[key] = asyncio.ensure_future(_probe(api_base, model, api_key))
    try:
        window = await asyncio.shield(pending)
    except asyncio.CancelledError:
        raise
    except Exception:  # noqa: BLE001 - a server that cannot say: the window stays unknown
        window = None
    _FOUND[key] = window
    _ASKED.pop(key, None)
    return window


def forget() -> None:
    """Forget every answer (tests; a restarted server)."""
    _ASKED.clear()
    _FOUND.clear()


async def _probe(api_base: str, model: str, api_key: str | None) -> int | None:
    import aiohttp

    name = _PREFIX.sub("", model)
    base = api_base.rstrip("/")
    root = re.sub(r"/v1$", "", base)
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    timeout = aiohttp.ClientTimeout(total=PROBE_TIMEOUT)
    async with aiohttp.ClientSession(timeout=timeout, headers=headers) as session:
        async def get(path_or_url: str, post: dict | None = None) -> Any:
            url = path_or_url if path_or_url.startswith("http") else root + path_or_url
            try:
                request = session.post(url, json=post) if post is not None \
                    else session.get(url)
                async with request as response:
                    if response.status != 200:
                        return None
                    return await response.json(content_type=None)
            except (aiohttp.ClientError, asyncio.TimeoutError, ValueError):
                return None

        models_url = base + "/models" if base.endswith("/v1") else root + "/v1/models"
        props, models, running, shown = await asyncio.wait_for(asyncio.gather(
            get("/props"), get(models_url), get("/api/ps"),
            get("/api/show", {"model": name})), PROBE_TIMEOUT + 0.5)
        window = _llama_cpp(props)
        if window is None and isinstance(props, dict):
            window = _llama_cpp_slots(await get("/slots"))
        return (window or _vllm(models, name) or _ollama(running, shown, name))


def _positive(value: Any) -> int | None:
    try:
        number = int(value)
    except (TypeError, ValueError):
        return None
    return number if number > 0 else None


def _llama_cpp(props: Any) -> int | None:
    if not isinstance(props, dict):
        return None
    settings = props.get("default_generation_settings")
    if isinstance(settings, dict) and _positive(settings.get("n_ctx")):
        return _positive(settings.get("n_ctx"))
    return _positive(props.get("n_ctx"))


def _llama_cpp_slots(slots: Any) -> int | None:
    if isinstance(slots, list):
        sizes = [_positive(s.get("n_ctx")) for s in slots if isinstance(s, dict)]
        sizes = [s for s in sizes if s]
        return min(sizes) if sizes else None
    return None


def _vllm(models: Any, name: str) -> int | None:
    if not isinstance(models, dict) or not isinstance(models.get("data"), list):
        return None
    entries = [m for m in models["data"] if isinstance(m, dict)]
    mine = [m for m in entries if m.get("id") == name] or \
        (entries if len(entries) == 1 else [])
    return _positive(mine[0].get("max_model_len")) if mine else None


def _ollama(running: Any, shown: Any, name: str) -> int | None:
    if isinstance(running, dict) and isinstance(running.get("models"), list):
        for entry in running["models"]:
            if isinstance(entry, dict) and name in (entry.get("name"), entry.get("model")) \
                    and _positive(entry.get("context_length")):
                return _positive(entry.get("context_length"))
    if not isinstance(shown, dict) or not ("model_info" in shown or "parameters" in shown):
        return None
    match = re.search(r"^\s*num_ctx\s+(\d+)", str(shown.get("parameters") or ""), re.M)
    if match:
        return int(match.group(1))
    trained = next((_positive(v) for k, v in (shown.get("model_info") or {}).items()
                    if k.endswith(".context_length")), None)
    return min(OLLAMA_DEFAULT_NUM_CTX, trained or OLLAMA_DEFAULT_NUM_CTX)
