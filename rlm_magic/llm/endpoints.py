"""Where a client's calls go, and so which transport, rate gate and retries they get.

Two kinds of endpoint, chosen from the settings at each call (a ``%config`` takes
effect on the next one):

- ``ProviderEndpoint``: a provider or a server of the user's (``RLM.api_base`` and
  ``RLM.api_key``, else litellm's environment variables). OpenAI-compatible endpoints go
  over the wire transport, every other provider through litellm.
- ``RouterEndpoint``: a LiteLLM Router for ``RLM.model_list`` (``transports.router``):
  it retries and fails over itself, so the client adds no retries of its own.

A test (or another front end) can give the client a transport of its own: every call
then goes to it, with the provider endpoint's gate and retries, whatever the settings.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

from ..errors import APIKeyError, ConfigError
from . import keys, litellm_loader
from .litellm_loader import loaded_litellm
from .messages import Messages
from .pricing import tiered_price
from .ratelimit import RateGate, gate_for
from .transports.base import Request, Transport
from .transports.litellm import LiteLLMTransport
from .transports.router import RouterTransport, build_router, deployments, groups, identity
from .transports.wire import Route, WireTransport, fits, light_route, route_for

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
        """A ``ConfigError`` for a model this endpoint cannot serve (an ``APIKeyError``
        for one with no key anywhere), before anything is sent."""

    def key_failure(self, failure: BaseException, model: str) -> APIKeyError | None:
        """The ``APIKeyError`` a failed attempt stands for (a key refused, or none
        sent), else None."""
        ...

    def attempts(self) -> tuple[int, float]:
        """(how many times the client retries a failed call, seconds per attempt)."""
        ...

    def request(self, model: str, messages: Messages, params: dict[str, Any]) -> Request:
        """The request as litellm takes it (the wire transport sends the same)."""
        ...

    def transport(self, model: str, litellm: Any) -> Transport: ...

    def light(self, model: str) -> bool:
        """Whether calls to ``model`` go without litellm (not imported for them): over the
        wire, priced from litellm's bundled price map."""
        ...

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
        self.given_transport = transport  # sends every call when given

    @property
    def identity(self) -> str | None:
        return self.config.api_base

    def check(self, model: str) -> None:
        if self.given_transport is None:
            missing = keys.missing_key(loaded_litellm(), self.config, model)
            if missing is not None:
                raise missing

    def key_failure(self, failure: BaseException, model: str) -> APIKeyError | None:
        return keys.key_failure(failure, loaded_litellm(), self.config, model)

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
        elif keys.keyless(loaded_litellm(), config, model):
            # A server of the user's with no key set: litellm's OpenAI client will not
            # send a request without one, and such a server ignores it (the wire
            # transport sends no key at all).
            request["api_key"] = keys.PLACEHOLDER_KEY
        return request

    def light(self, model: str) -> bool:
        return litellm_loader.loaded_litellm() is None and self._light_route(model) is not None

    def _light_route(self, model: str) -> Route | None:
        config = self.config
        if self.given_transport is not None or not (
            config.wire_transport and fits(config.litellm_kwargs)
        ):
            return None
        route = light_route(model, config.api_base, config.api_key)
        if route is None or tiered_price(route.price_names):
            return None  # a price by the prompt's size: litellm's reckoning
        return route

    def transport(self, model: str, litellm: Any) -> Transport:
        """Straight over the wire when the endpoint is OpenAI-compatible and the request
        is OpenAI's as it stands, else through litellm."""
        if self.given_transport is not None:
            return self.given_transport
        config = self.config
        if litellm is None:
            light = self._light_route(model)
            if light is not None:
                return WireTransport(light, None)
            litellm = litellm_loader.import_litellm()  # (callers load it first: see light)
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


class RouterEndpoint:
    """Calls go through one Router, built once for one configuration."""

    probes_local_servers = False  # its deployments' windows come from litellm's model info

    def __init__(self, config: RLMConfig, identity: str):
        self.config = config
        self.identity = identity
        self._router: Any = None

    def check(self, model: str) -> None:
        known = groups(self.config.model_list)
        if model not in known:
            raise ConfigError(
                f"{model!r} is not a model group of RLM.model_list (its groups: {', '.join(known)})"
            )

    def key_failure(self, failure: BaseException, model: str) -> APIKeyError | None:
        return keys.key_failure(failure, loaded_litellm(), self.config, model, routed=True)

    def attempts(self) -> tuple[int, float]:
        """(retries of ours, seconds an attempt may take): the Router retries itself,
        each of its attempts within ``RLM.timeout``."""
        return 0, self.config.timeout * (self.config.max_retries + 1)

    def request(self, model: str, messages: Messages, params: dict[str, Any]) -> Request:
        # Keys and endpoints are the deployments', in the model list.
        return {
            "model": model,
            "messages": messages,
            "timeout": self.config.timeout,
            "max_retries": 0,
            **params,
        }

    def light(self, model: str) -> bool:
        return False

    def transport(self, model: str, litellm: Any) -> LiteLLMTransport:
        return RouterTransport(self.router(litellm).acompletion, litellm)

    def router(self, litellm: Any) -> Any:
        if self._router is None:
            self._router = build_router(
                litellm,
                self.config.model_list,
                self.config.router_settings,
                num_retries=self.config.max_retries,
                timeout=self.config.timeout,
            )
        return self._router

    def gate(self, model: str) -> RateGate:
        # A group's deployments send headers of their own limits, not the group's:
        # through a Router the gate pauses on 429s but learns no pace from headers.
        config = self.config
        return gate_for(
            model, self.identity, None, config.rpm, config.tpm, learns_from_headers=False
        )

    def models_behind(self, model: str) -> list[str]:
        return deployments(self.config.model_list, model)


class Endpoints:
    """A client's endpoint for its settings as they are now: the provider's, or a Router
    built once per model list (and its retries and timeout)."""

    def __init__(self, config: RLMConfig, transport: Transport | None = None):
        self.config = config
        self.provider = ProviderEndpoint(config, transport)
        self._routed: tuple[Any, RouterEndpoint] | None = None

    def current(self) -> Endpoint:
        config = self.config
        if not config.model_list or self.provider.given_transport is not None:
            return self.provider
        name = identity(config.model_list, config.router_settings)
        key = (name, config.max_retries, config.timeout)
        if self._routed is None or self._routed[0] != key:
            self._routed = (key, RouterEndpoint(config, name))
        return self._routed[1]
