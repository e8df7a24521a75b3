"""The wire transport: OpenAI-compatible endpoints straight over aiohttp, at a fifteenth
of litellm's CPU per call (``RLM.wire_transport``, on by default).

- ``routes``: which models and endpoints it serves, and where each request goes;
- ``transport``: ``WireTransport``, sending one route's requests;
- ``sse``: reading a streamed answer; ``parsing``: reading a whole one;
- ``errors``: HTTP failures as the exceptions litellm would raise;
- ``sessions``: one aiohttp session per event loop.
"""

from __future__ import annotations

from .routes import (
    CHAT_PARAMETERS,
    ROUTE_ENVIRONMENT,
    Route,
    fits,
    light_route,
    litellm_settings,
    route_for,
)
from .sessions import close_sessions
from .sse import MAX_LINE
from .transport import WireTransport

__all__ = [
    "CHAT_PARAMETERS",
    "MAX_LINE",
    "ROUTE_ENVIRONMENT",
    "Route",
    "WireTransport",
    "close_sessions",
    "fits",
    "light_route",
    "litellm_settings",
    "route_for",
]
