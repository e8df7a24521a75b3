"""litellm, imported on first use and kept tidy on the kernel's loop.

Importing litellm takes seconds, so nothing imports it before the first model call
(``%load_ext rlm_magic`` stays instant), and that call imports it in a thread while the
loop goes on (``load_litellm``). Two of its habits are managed here too: the worker task
it starts on the loop to log each answer (parked once no call is under way) and its
TLS settings, which the wire transport shares.
"""

from __future__ import annotations

import asyncio
import os
import sys
import warnings
from typing import Any

_litellm: Any = None
_lock: asyncio.Lock | None = None
_calls = 0  # model calls under way, in every client of the process
_parking: set[asyncio.Task[Any]] = set()  # held: the loop keeps only weak references to tasks


def import_litellm() -> Any:
    """litellm, imported now if it is not yet (blocking: a script, or a thread)."""
    global _litellm
    if _litellm is None:
        # Without this, importing litellm fetches its price map from the internet (and
        # logs warnings when offline). The bundled map is current for our pinned range.
        os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
        import gc

        import litellm

        litellm.suppress_debug_info = True  # no "Give Feedback / Get Help" banners in cells
        # pydantic warns, the first time litellm builds some of its own types (a Router, a
        # streamed answer), that they use `ReadOnly`: noise in a cell, nothing to act on.
        warnings.filterwarnings(
            "ignore", message=r".*is using the `ReadOnly` qualifier", category=UserWarning
        )
        warnings.filterwarnings(
            "ignore", message=r".*are using the `ReadOnly` qualifier", category=UserWarning
        )
        # A streamed call cancelled (an interrupt, a stopped step) at the moment litellm
        # has made its streaming coroutine but not yet awaited it leaves this behind.
        warnings.filterwarnings(
            "ignore",
            message=r"coroutine '.*async_streaming' was never awaited",
            category=RuntimeWarning,
        )
        # The wire transport's TLS context (certificates loaded: ~10 ms) is made here,
        # off the loop, rather than when the first request opens a session.
        _litellm_ssl_context()
        # litellm's import leaves ~400k objects for the cyclic GC to walk: a full
        # collection then takes ~180 ms, a stall of the kernel's loop in the middle of
        # a batch. They live as long as the process; freezing moves them out of the
        # collector's way (they are still freed by reference counting).
        gc.collect()
        gc.freeze()
        _litellm = litellm
    return _litellm


async def load_litellm() -> Any:
    """Import litellm on first use, in a thread: the import takes seconds, and the
    kernel's loop (progress bars, other cells' tasks) should keep running meanwhile."""
    global _lock
    if _litellm is not None:
        return _litellm
    if _lock is None:
        _lock = asyncio.Lock()
    async with _lock:
        if _litellm is None:
            await asyncio.to_thread(import_litellm)
    return _litellm


def loaded_litellm() -> Any:
    """litellm if it has been imported, else None (nothing here imports it)."""
    return _litellm


def imported_litellm() -> Any:
    """litellm if it is imported, by rlm-magic or by the user, and not in the middle of
    an import (its module then exists, half built: touching it from another thread
    breaks that import), else None."""
    if _litellm is not None:
        return _litellm
    module = sys.modules.get("litellm")
    if module is None or litellm_is_loading():
        return None
    if getattr(getattr(module, "__spec__", None), "_initializing", False):
        return None  # another thread is importing it (the demo's prices, say)
    return module


def litellm_is_loading() -> bool:
    """True while litellm's first import is underway (seconds, in a thread): calls
    already admitted are waiting for it, not in flight, and progress says so."""
    return _litellm is None and _lock is not None and _lock.locked()


_light_ssl: Any = None


def ssl_context() -> Any:
    """litellm's SSL settings (``SSL_CERT_FILE``, ``litellm.ssl_verify``, certifi); litellm
    caches the context, so only the first call loads certificates. While litellm is not
    imported (an OpenAI-compatible endpoint needs none of it), the same settings read
    from the environment: ``SSL_VERIFY``, ``SSL_CERT_FILE``, certifi's bundle,
    ``SSL_SECURITY_LEVEL``, ``SSL_ECDH_CURVE``, TLS 1.2 at least."""
    global _light_ssl
    if imported_litellm() is None:
        if _light_ssl is None:
            _light_ssl = _environment_ssl_context()
        return _light_ssl
    return _litellm_ssl_context()


def _litellm_ssl_context() -> Any:
    try:
        from litellm.llms.custom_httpx.http_handler import get_ssl_configuration

        return get_ssl_configuration()
    except Exception:  # noqa: BLE001 - aiohttp's default context
        return True


def _environment_ssl_context() -> Any:
    import ssl

    verify: Any = os.environ.get("SSL_VERIFY", True)
    if isinstance(verify, str) and not os.path.exists(verify):
        word = verify.strip().lower()
        verify = False if word in ("false", "0", "no", "off") else True
    if verify is False:
        return False
    cafile = verify if isinstance(verify, str) else None
    if cafile is None:
        given = os.environ.get("SSL_CERT_FILE")
        if given and os.path.exists(given):
            cafile = given
        else:
            try:
                import certifi

                cafile = certifi.where()
            except ImportError:  # the system's certificates
                cafile = None
    context = ssl.create_default_context(cafile=cafile)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    level = os.environ.get("SSL_SECURITY_LEVEL")
    if level:
        context.set_ciphers(level)
    curve = os.environ.get("SSL_ECDH_CURVE")
    if curve:
        try:
            context.set_ecdh_curve(curve)
        except (AttributeError, ValueError):
            pass
    return context


# -- litellm's logging worker ----------------------------------------------------------------


def call_started() -> None:
    global _calls
    _calls += 1


def call_ended() -> None:
    global _calls
    _calls -= 1
    if not _calls:
        _park_logging_worker_soon()


def _park_logging_worker_soon() -> None:
    """litellm logs each answer through a worker task it starts on the loop of the
    call and never ends: once no call is under way (a second later, after litellm has
    queued its last callbacks), they run and the task ends. The next call starts it
    again."""
    if _litellm is None:
        return
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        return

    def park() -> None:
        if not _calls:
            task = loop.create_task(_park_logging_worker())
            _parking.add(task)
            task.add_done_callback(_parking.discard)

    loop.call_later(1.0, park)


async def _park_logging_worker() -> None:
    try:
        from litellm.litellm_core_utils.logging_worker import GLOBAL_LOGGING_WORKER as worker
    except ImportError:  # a litellm without one
        return
    if _calls or getattr(worker, "_worker_task", None) is None:
        return
    try:
        await asyncio.wait_for(worker.flush(), 5.0)
        if not _calls:
            await worker.stop()
    except Exception:  # noqa: BLE001 - logging's housekeeping must never fail a cell
        pass
