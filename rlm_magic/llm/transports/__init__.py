"""How a chat request reaches a model: the transports behind one typed seam (``base``).

- ``litellm``: ``litellm.acompletion``, for every provider litellm knows;
- ``router``: a LiteLLM Router's ``acompletion`` (``RLM.model_list``), which retries and
  fails over itself;
- ``wire``: OpenAI-compatible endpoints straight over aiohttp, at a fifteenth of
  litellm's CPU per call.

Which one a call takes is the endpoint's choice (``..endpoints``).
"""

from __future__ import annotations

from ..litellm_loader import loaded_litellm
from ..messages import Messages
from .base import Answer, Request, Transport
from .wire.sessions import close_sessions


async def close_loop_clients() -> None:
    """Close every transport's connections of the running loop, before the loop ends.

    litellm keeps a set of connection pools per event loop and never closes them; a
    script that calls ``RLM.run`` (one ``asyncio.run`` each) would otherwise leave every
    run's connections open until the process runs out of descriptors."""
    close = getattr(loaded_litellm(), "close_litellm_async_clients", None)
    if close is not None:
        await close()
    await close_sessions()


__all__ = ["Answer", "Messages", "Request", "Transport", "close_loop_clients"]
