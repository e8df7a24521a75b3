"""The context window a local server really runs a model with, asked of the server.

litellm's model map knows cloud models; a local server runs whatever it was started
with (llama.cpp's ``--ctx-size`` split over its slots, vLLM's ``--max-model-len``,
Ollama's ``num_ctx``), and each says so at an endpoint of its own:

- llama.cpp: ``GET /props`` (``default_generation_settings.n_ctx``, a slot's context),
  else ``GET /slots`` (each slot's ``n_ctx``);
- vLLM: ``GET /v1/models`` (``max_model_len`` of the model);
- Ollama: ``GET /api/ps`` (``context_length`` of a loaded model), else
  ``POST /api/show`` (a ``num_ctx`` parameter), else a guess: Ollama's default of 4,096
  tokens (at most the model's own ``context_length``).

A server is asked once per (api_base, model), on the running loop, all endpoints at
once and for at most ``PROBE_TIMEOUT`` seconds: a server that is down or is none of
these costs the first call that long at most, and is not asked again. A guess is only
advice (chunk sizes, when to compact), never a reason to refuse a prompt, and is not
kept: the server is asked again a minute later (a model loaded since says its window).

Only models of OpenAI-compatible and Ollama providers at a configured ``api_base`` are
asked, and the endpoints of local servers only of a host on this machine or the local
network (loopback, private or link-local addresses): elsewhere (a cloud provider, a
company's proxy) only ``GET /v1/models``, the OpenAI API's own, is asked. No answer is
read past ``MAX_BODY`` bytes.

The same answers say what kind of server it is and, for llama.cpp, how many requests
it runs at once (``total_slots`` in ``/props``, else the number of ``/slots``): calls to
it are held to that many (``slots``); llama.cpp and vLLM take a JSON schema for typed
answers (``structured``) and count a text's tokens at ``POST /tokenize``
(``count_tokens``), which sizes chunks to this model's tokenizer before the first turn
and counts a prompt near the window (``windows``: litellm is not imported to count it).
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import re
import time
from typing import Any
from urllib.parse import urlsplit

from .keys import sent_key
from .profiles import PROFILES

PROBE_TIMEOUT = 2.0
RESOLVE_TIMEOUT = 0.5  # of the api_base's host name, within the probe's time
OLLAMA_DEFAULT_NUM_CTX = 4096  # what Ollama runs a model with unless told otherwise
GUESS_KEPT_S = 60.0  # a guessed window is asked about again after this long
MAX_BODY = 1_000_000  # bytes of a probe's answer read at most

# litellm's provider prefixes: the server knows the model by the rest of the name.
_PREFIX = re.compile(
    r"^(?:openai|hosted_vllm|ollama|ollama_chat|llamafile|lm_studio|"
    r"text-completion-openai|custom_openai)/"
)


def reported_window(api_base: str | None, model: str) -> int | None:
    """The window the server at ``api_base`` reported for ``model``, if it did."""
    at = PROFILES.known_at(api_base, model) if api_base else None
    return at.server_window if at is not None else None


def guessed_window(api_base: str | None, model: str) -> int | None:
    """The window the server probably runs ``model`` with, when it did not say
    (Ollama's default): advice only."""
    at = PROFILES.known_at(api_base, model) if api_base else None
    guess = at.window_guess if at is not None else None
    return guess[0] if guess else None


def asked(api_base: str | None, model: str) -> bool:
    if not may_ask(api_base, model):
        return True
    at = PROFILES.known_at(api_base, model)
    if at is None:
        return False
    guess = at.window_guess
    return at.server_asked or (guess is not None and time.monotonic() - guess[1] < GUESS_KEPT_S)


def settled(api_base: str | None, model: str) -> bool:
    """Whether the server was asked for good: it answered (or is not asked at all); a
    guessed window is asked again when it gets old."""
    if not may_ask(api_base, model):
        return True
    at = PROFILES.known_at(api_base, model)
    return at is not None and at.server_asked


def may_ask(api_base: str | None, model: str) -> bool:
    """Only an OpenAI-compatible or Ollama model at an api_base of the user's is asked
    (not Azure's, Anthropic's or OpenAI's own endpoints: their windows are known)."""
    return (
        bool(api_base) and bool(_PREFIX.match(model)) and "api.openai.com" not in (api_base or "")
    )


async def ask(api_base: str | None, model: str, api_key: str | None = None) -> int | None:
    """The server's window for ``model`` (asked once; None if it does not say).
    ``api_key``: ``RLM.api_key``; the server is sent the key ``model``'s chat calls
    carry there (``keys.sent_key``: an environment key only where it may go)."""
    if not api_base or not may_ask(api_base, model):
        return None
    at = PROFILES.at(api_base, model)
    if at.server_asked:
        return at.server_window
    if asked(api_base, model):
        return None  # a recent guess only
    pending = at.probe
    if pending is None or pending.get_loop() is not asyncio.get_running_loop():
        pending = at.probe = asyncio.ensure_future(
            _probe(api_base, model, sent_key(model, api_base, api_key))
        )
    try:
        found = await asyncio.shield(pending)
        window, guessed, at.server_kind, at.server_slots, at.server_is_local = found
    except asyncio.CancelledError:
        raise
    except Exception:  # noqa: BLE001 - a server that cannot say: the window stays unknown
        window, guessed = None, False
    if at.server_kind in ("llama.cpp", "vllm"):
        profile = PROFILES.model(model)
        if profile.server_takes_schema is None:  # (a refusal since would have said False)
            profile.server_takes_schema = True  # both take a JSON schema (grammar-bound)
    if guessed and window:
        at.window_guess = (window, time.monotonic())
    else:
        at.server_asked, at.server_window = True, window
        at.window_guess = None
    at.probe = None
    return None if guessed else window


async def is_local(host: str | None) -> bool:
    """Whether ``host`` is this machine or on the local network: a loopback, private or
    link-local address, or a name that resolves only to such (resolved in a thread,
    for at most ``RESOLVE_TIMEOUT`` seconds: then it counts as remote)."""
    if not host:
        return False
    try:
        return _local_address(host)
    except ValueError:  # a name
        pass
    try:
        found = await asyncio.wait_for(
            asyncio.get_running_loop().getaddrinfo(host, None), RESOLVE_TIMEOUT
        )
    except (OSError, asyncio.TimeoutError, UnicodeError):
        return False
    addresses = {entry[4][0] for entry in found}
    try:
        return bool(addresses) and all(_local_address(str(a)) for a in addresses)
    except ValueError:
        return False


def _local_address(text: str) -> bool:
    address = ipaddress.ip_address(text.split("%")[0])  # ValueError: not an address
    return address.is_loopback or address.is_private or address.is_link_local


Found = tuple[int | None, bool, str | None, int | None, bool]


async def _probe(api_base: str, model: str, api_key: str | None) -> Found:
    """(the window, whether it is a guess, the kind of server, its slots, whether it is
    local)."""
    import aiohttp

    name = _PREFIX.sub("", model)
    base = api_base.rstrip("/")
    root = server_root(api_base)
    started = time.monotonic()
    local = await is_local(urlsplit(base).hostname)
    timeout = aiohttp.ClientTimeout(total=PROBE_TIMEOUT)
    async with aiohttp.ClientSession(timeout=timeout, headers=_auth(api_key)) as session:

        async def get(path_or_url: str, post: dict[str, Any] | None = None) -> Any:
            if not local and path_or_url.startswith("/"):
                return None  # a local server's own endpoint: not asked of other hosts
            url = path_or_url if path_or_url.startswith("http") else root + path_or_url
            return await read_json(session, url, post)

        models_url = base + "/models" if base.endswith("/v1") else root + "/v1/models"
        props, models, running, shown = await asyncio.wait_for(
            asyncio.gather(
                get("/props"), get(models_url), get("/api/ps"), get("/api/show", {"model": name})
            ),
            max(0.5, PROBE_TIMEOUT + 0.5 - (time.monotonic() - started)),
        )
        window = _llama_cpp(props)
        slots = _positive(props.get("total_slots")) if isinstance(props, dict) else None
        if (window is None or slots is None) and isinstance(props, dict):
            listed = await get("/slots")
            window = window or _llama_cpp_slots(listed)
            slots = slots or (len(listed) if isinstance(listed, list) and listed else None)
        kind = _kind(props, models, running, shown, name)
        window = window or _vllm(models, name) or _ollama(running, shown, name)
        if window:
            return window, False, kind, slots, local
        return _ollama_default(shown), True, kind, slots, local


def server_root(api_base: str) -> str:
    """The server's own address: the api_base without its ``/v1``."""
    return re.sub(r"/v1$", "", api_base.rstrip("/"))


def _auth(api_key: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


async def read_json(session: Any, url: str, post: dict[str, Any] | None = None) -> Any:
    """The JSON a GET (or a POST of ``post``) answers with status 200, read up to
    ``MAX_BODY`` bytes; None for anything else."""
    text = await read_text(session, url, post)
    try:
        return None if text is None else json.loads(text)
    except ValueError:
        return None


async def read_text(session: Any, url: str, post: dict[str, Any] | None = None) -> str | None:
    import aiohttp

    try:
        request = session.post(url, json=post) if post is not None else session.get(url)
        async with request as response:
            if response.status != 200 or (response.content_length or 0) > MAX_BODY:
                return None
            body = bytearray()
            async for piece in response.content.iter_chunked(65536):
                body += piece
                if len(body) > MAX_BODY:
                    return None
            return bytes(body).decode("utf-8", "replace")
    except (aiohttp.ClientError, asyncio.TimeoutError, ValueError):
        return None


def server_kind(api_base: str | None, model: str) -> str | None:
    """What the probe found serving ``model`` at ``api_base``: "llama.cpp", "vllm",
    "ollama", or None (not asked yet, or none of these)."""
    at = PROFILES.known_at(api_base, model) if api_base else None
    return at.server_kind if at is not None else None


def local_server_kind(api_base: str | None, model: str) -> str | None:
    """``server_kind`` of a server on this machine or the local network (whose own
    endpoints may be asked), else None."""
    at = PROFILES.known_at(api_base, model) if api_base else None
    return at.server_kind if at is not None and at.server_is_local else None


async def count_tokens(
    api_base: str, model: str, text: str, api_key: str | None = None
) -> int | None:
    """Tokens of ``text`` by the server's own tokenizer (llama.cpp's and vLLM's
    ``POST /tokenize``), within ``PROBE_TIMEOUT``; None where it cannot say. Sent the
    key ``model``'s chat calls carry (``api_key``: ``RLM.api_key``; see ``ask``)."""
    import aiohttp

    if not tokenizes(api_base, model):
        return None
    kind = local_server_kind(api_base, model)
    post: dict[str, Any] = (
        {"content": text}
        if kind == "llama.cpp"
        else {"model": _PREFIX.sub("", model), "prompt": text}
    )
    timeout = aiohttp.ClientTimeout(total=PROBE_TIMEOUT)
    headers = _auth(sent_key(model, api_base, api_key))
    async with aiohttp.ClientSession(timeout=timeout, headers=headers) as session:
        answer = await read_json(session, server_root(api_base) + "/tokenize", post)
    tokens = answer.get("tokens") if isinstance(answer, dict) else None
    counted = (_positive(answer.get("count")) if isinstance(answer, dict) else None) or (
        len(tokens) if isinstance(tokens, list) else None
    )
    if counted is None:
        # (a server started without it, or one too busy to say): each prompt fitted to
        # its window would wait for it again
        _NOT_TOKENIZING[(api_base, model)] = (time.monotonic(), PROFILES.generation)
    return counted


def tokenizes(api_base: str | None, model: str) -> bool:
    """Whether ``count_tokens`` may ask the server: it is llama.cpp or vLLM, local, and
    its ``/tokenize`` has not failed in the last ``GUESS_KEPT_S`` seconds."""
    if local_server_kind(api_base, model) not in ("llama.cpp", "vllm"):
        return False
    failed = _NOT_TOKENIZING.get((api_base or "", model))
    return (
        failed is None
        or failed[1] != PROFILES.generation  # (forgotten with what was learned of it)
        or time.monotonic() - failed[0] > GUESS_KEPT_S
    )


# When each server's /tokenize last failed, and what PROFILES had learned then.
_NOT_TOKENIZING: dict[tuple[str, str], tuple[float, int]] = {}


def _kind(props: Any, models: Any, running: Any, shown: Any, name: str) -> str | None:
    if isinstance(props, dict) and (
        "default_generation_settings" in props or "total_slots" in props
    ):
        return "llama.cpp"
    if _vllm(models, name):
        return "vllm"
    if _is_ollama_show(shown) or (isinstance(running, dict) and "models" in running):
        return "ollama"
    return None


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
        found = [_positive(s.get("n_ctx")) for s in slots if isinstance(s, dict)]
        sizes = [size for size in found if size]
        return min(sizes) if sizes else None
    return None


def _vllm(models: Any, name: str) -> int | None:
    if not isinstance(models, dict) or not isinstance(models.get("data"), list):
        return None
    entries = [m for m in models["data"] if isinstance(m, dict)]
    mine = [m for m in entries if m.get("id") == name] or (entries if len(entries) == 1 else [])
    return _positive(mine[0].get("max_model_len")) if mine else None


def _ollama(running: Any, shown: Any, name: str) -> int | None:
    if isinstance(running, dict) and isinstance(running.get("models"), list):
        for entry in running["models"]:
            if (
                isinstance(entry, dict)
                and name in (entry.get("name"), entry.get("model"))
                and _positive(entry.get("context_length"))
            ):
                return _positive(entry.get("context_length"))
    if not _is_ollama_show(shown):
        return None
    match = re.search(r"^\s*num_ctx\s+(\d+)", str(shown.get("parameters") or ""), re.M)
    return int(match.group(1)) if match else None


def _is_ollama_show(shown: Any) -> bool:
    return isinstance(shown, dict) and ("model_info" in shown or "parameters" in shown)


def _ollama_default(shown: Any) -> int | None:
    """An Ollama model neither loaded nor given a num_ctx probably runs with Ollama's
    default (at most the model's own context_length): a guess."""
    if not _is_ollama_show(shown):
        return None
    info = shown.get("model_info")
    trained = (
        next((_positive(v) for k, v in info.items() if k.endswith(".context_length")), None)
        if isinstance(info, dict)
        else None
    )
    return min(OLLAMA_DEFAULT_NUM_CTX, trained or OLLAMA_DEFAULT_NUM_CTX)
