"""Where a client's calls go, and so which transport, rate gate and retries they get.

Two kinds of endpoint, chosen from the settings at each call (a ``%config`` takes
effect on the next one):

- ``ProviderEndpoint``: a provider or a server of the user's (``RLM.api_base`` and
  ``RLM.api_key``, else litellm's environment variables). OpenAI-compatible endpoints go
  over the wire transport, every other provider through litellm.
- ``RouterEndpoint`` (``transports.router``): a LiteLLM Router for ``RLM.model_list``.

A test (or another front end) can give the client a transport of its own: every call
then goes to it, with the provider endpoint's gate and retries.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

from .messages import Messages
from .ratelimit import RateGate, gate_for
from .transports.base import Request, Transport
from .transports.litellm import LiteLLMTransport
from .transports.router import RouterEndpoint, identity
from .transports.wire import WireTransport, fits, route_for

if TYPE_CHECKING:
    from ..config import RLMConfig


class Endpoint(Protocol):
    """What the client asks of where its calls go."""

    @property
    def identity(self) -> str | None:
        """The api_base, or the Router configuration's name: rate gates, the cache and
        the windows learned from errors are kept per endpoint."""
        ...

    @property
    def probes_local_servers(self) -> bool:
        """Whether a local server here is asked for its models' windows."""
        ...

    def check(self, model: str) -> None:
        """A ``ConfigError`` for a model this endpoint cannot serve."""

    def attempts(self) -> tuple[int, float]:
        """(how many times the client retries a failed call, seconds per attempt)."""
        ...

    def request(self, model: str, messages: Messages, params: dict[str, Any]) -> Request:
        """The request as litellm takes it (the wire transport sends the same)."""
        ...

    def transport(self, model: str, litellm: Any) -> Transport: ...

    def gate(self, model: str) -> RateGate:
        """The rate gate of ``model`` here (shared by every client of the loop)."""
        ...

    def models_behind(self, model: str) -> list[str]:
        """Other litellm models whose windows bound ``model``'s (a Router group's)."""
        ...


class ProviderEndpoint:
    """A provider's endpoint, or a server of the user's, read from the settings."""

    probes_local_servers = True

    def __init__(self, config: RLMConfig, transport: Transport | None = None):
        self.config = config
        self._transport = transport

    @property
    def identity(self) -> str | None:
        return self.config.api_base

    def check(self, model: str) -> None:
        pass

    def attempts(self) -> tuple[int, float]:
        return self.config.max_retries, self.config.timeout

    def request(self, model: str, messages: Messages, params: dict[str, Any]) -> Request:
        config = self.config
        request = {
            "model": model,
            "messages": messages,
            "timeout": config.timeout,
            # Retries are ours (backoff, jitter, counted in the ledger): stop the
            # provider SDK from retrying underneath us.
            "max_retries": 0,
            **params,
        }
        if config.api_base:
            request["api_base"] = config.api_base
        if config.api_key:
            request["api_key"] = config.api_key
        return request

    def transport(self, model: str, litellm: Any) -> Transport:
        """Straight over the wire when the endpoint is OpenAI-compatible and the request
        is OpenAI's as it stands, else through litellm."""
        if self._transport is not None:
            return self._transport
        config = self.config
        if config.wire_transport and fits(config.litellm_kwargs):
            route = route_for(litellm, model, config.api_base, config.api_key)
            if route is not None:
                return WireTransport(route, litellm)
        return LiteLLMTransport(litellm.acompletion, litellm)

    def gate(self, model: str) -> RateGate:
        config = self.config
        return gate_for(model, config.api_base, config.api_key, config.rpm, config.tpm)

    def models_behind(self, model: str) -> list[str]:
        return []


class Endpoints:
    """A client's endpoint for its settings as they are now: the provider's, or a Router
    built once per model list (and its retries and timeout)."""

    def __init__(self, config: RLMConfig, transport: Transport | None = None):
        self.config = config
        self.provider = ProviderEndpoint(config, transport)
        self._routed: tuple[Any, RouterEndpoint] | None = None

    def current(self) -> Endpoint:
        config = self.config
        if not config.model_list:
            return self.provider
        name = identity(config.model_list, config.router_settings)
        key = (name, config.max_retries, config.timeout)
        if self._routed is None or self._routed[0] != key:
            self._routed = (key, RouterEndpoint(config, name))
        return self._routed[1]
