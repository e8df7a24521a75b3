"""Where a client's calls go, and so which transport, rate gate and retries they get.

Two kinds of endpoint, chosen from the settings at each call (a ``%config`` takes
effect on the next one):

- ``ProviderEndpoint``: a provider or a server of the user's (``RLM.api_base`` and
  ``RLM.api_key``, else litellm's environment variables). OpenAI-compatible endpoints go
  over the wire transport, every other provider through litellm.
- ``RouterEndpoint``: a LiteLLM Router for ``RLM.model_list`` (``transports.router``):
  it retries and fails over itself, so the client adds no retries of its own.

What every call to one model shares (its transport, gate, retries and the request's
fixed fields) is its ``CallPlan``, kept until the settings, the environment's keys and
bases, litellm or what the session learned change: a call reads one, not ~30 settings.

A test (or another front end) can give the client a transport of its own: every call
then goes to it, with the provider endpoint's gate and retries, whatever the settings.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any, Protocol

from ..errors import APIKeyError, ConfigError
from . import environment, keys, litellm_loader
from .litellm_loader import loaded_litellm
from .messages import Messages
from .pricing import highest_rates, tiered_price
from .profiles import PROFILES
from .ratelimit import RateGate, gate_for
from .transports.base import Request, Transport
from .transports.litellm import LiteLLMTransport
from .transports.router import (
    RouterTransport,
    build_router,
    deployments,
    group_rates,
    groups,
    identity,
)
from .transports.wire import (
    ROUTE_ENVIRONMENT,
    Route,
    WireTransport,
    fits,
    light_route,
    litellm_settings,
    route_for,
)

if TYPE_CHECKING:
    from ..config import RLMConfig


class CallPlan:
    """What every call to one model at one endpoint shares while nothing it was built
    from changes (``key``): how it is sent, its rate gate, its retries, and the
    request's fields besides the model, messages and parameters."""

    __slots__ = (
        "key",
        "transport",
        "gate",
        "retries_allowed",
        "attempt_timeout",
        "_fields",
        "windows_unsettled",
    )

    def __init__(
        self,
        key: tuple[Any, ...],
        transport: Transport | None,
        gate: RateGate,
        attempts: tuple[int, float],
        fields: tuple[dict[str, Any], dict[str, Any]],
    ):
        self.key = key
        # None: its calls go through litellm, which is not imported yet (``plan`` it
        # again with litellm).
        self.transport = transport
        self.gate = gate
        # How many times the client retries a failed call, and seconds per attempt.
        self.retries_allowed, self.attempt_timeout = attempts
        self._fields = fields  # (before the parameters, after them)
        # Its windows may yet be learned: looked up before each call until they are
        # settled (``LLMClient.look_up_windows``).
        self.windows_unsettled = True

    def request(self, model: str, messages: Messages, params: dict[str, Any]) -> Request:
        """One call's request, as litellm takes it (the wire transport sends the same)."""
        before, after = self._fields
        return {"model": model, "messages": messages, **before, **params, **after}


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

    def plan(self, model: str, litellm: Any) -> CallPlan:
        """What calls to ``model`` share now (``litellm``: the module if imported, else
        None); kept while nothing it depends on changes."""
        ...

    def transport(self, model: str, litellm: Any) -> Transport: ...

    def highest_rates(self, model: str, litellm: Any) -> tuple[float, float] | None:
        """Dollars per input and output token a call to ``model`` may be charged at
        most (what a budget holds); None when it has no price."""
        ...

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
        self._plans: dict[str, CallPlan] = {}

    @property
    def identity(self) -> str | None:
        return self.config.api_base

    def check(self, model: str) -> None:
        if self.given_transport is None:
            across = keys.api_key_across_providers(loaded_litellm(), self.config, model)
            if across is not None:
                raise across
            missing = keys.missing_key(loaded_litellm(), self.config, model)
            if missing is not None:
                raise missing

    def key_failure(self, failure: BaseException, model: str) -> APIKeyError | None:
        return keys.key_failure(failure, loaded_litellm(), self.config, model)

    def plan(self, model: str, litellm: Any) -> CallPlan:
        config = self.config
        key = (
            config.revision,
            tuple(config.litellm_kwargs),  # its names (``fits``), changed in place too
            _plan_environment(),  # (where keys go, and routes)
            litellm,
            litellm_settings(litellm),
            PROFILES.generation,
            asyncio.get_running_loop(),  # (gates are the loop's)
        )
        plan = self._plans.get(model)
        if plan is None or plan.key != key:
            plan = self._plans[model] = CallPlan(
                key,
                self._transport(model, litellm),
                self.gate(model),
                (config.max_retries, config.timeout),
                self._fields(model),
            )
        return plan

    def _fields(self, model: str) -> tuple[dict[str, Any], dict[str, Any]]:
        config = self.config
        # Retries are ours (backoff, jitter, counted in the ledger): stop the provider
        # SDK from retrying underneath us.
        before: dict[str, Any] = {"timeout": config.timeout, "max_retries": 0}
        after: dict[str, Any] = {}
        if config.api_base:
            after["api_base"] = config.api_base
        if config.api_key:
            after["api_key"] = config.api_key
        elif keys.keyless(loaded_litellm(), config, model):
            # A server of the user's with no key set, or one the environment's key must
            # not reach: litellm's clients send nothing without a key (and, given none,
            # read the environment's); such a server ignores this one (the wire
            # transport sends no key at all).
            after["api_key"] = keys.PLACEHOLDER_KEY
        return before, after

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
        transport = self._transport(model, litellm)
        if transport is None:  # (callers load litellm first: see light)
            transport = self._transport(model, litellm_loader.import_litellm())
        assert transport is not None
        return transport

    def _transport(self, model: str, litellm: Any) -> Transport | None:
        """``transport``, or None when it needs litellm and ``litellm`` is None."""
        if self.given_transport is not None:
            return self.given_transport
        config = self.config
        if litellm is None:
            light = self._light_route(model)
            return None if light is None else WireTransport(light, None)
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

    def highest_rates(self, model: str, litellm: Any) -> tuple[float, float] | None:
        return highest_rates(litellm, model)


class RouterEndpoint:
    """Calls go through one Router, built once for one configuration."""

    probes_local_servers = False  # its deployments' windows come from litellm's model info

    def __init__(self, config: RLMConfig, identity: str):
        self.config = config
        self.identity = identity
        self._router: Any = None
        self._plans: dict[str, CallPlan] = {}

    def check(self, model: str) -> None:
        known = groups(self.config.model_list)
        if model not in known:
            raise ConfigError(
                f"{model!r} is not a model group of RLM.model_list (its groups: {', '.join(known)})"
            )

    def key_failure(self, failure: BaseException, model: str) -> APIKeyError | None:
        return keys.key_failure(failure, loaded_litellm(), self.config, model, routed=True)

    def plan(self, model: str, litellm: Any) -> CallPlan:
        config = self.config
        key = (config.revision, litellm, PROFILES.generation, asyncio.get_running_loop())
        plan = self._plans.get(model)
        if plan is None or plan.key != key:
            plan = self._plans[model] = CallPlan(
                key,
                None if litellm is None else self.transport(model, litellm),
                self.gate(model),
                # The Router retries itself, each of its attempts within RLM.timeout.
                (0, config.timeout * (config.max_retries + 1)),
                # Keys and endpoints are the deployments', in the model list.
                ({"timeout": config.timeout, "max_retries": 0}, {}),
            )
        return plan

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

    def highest_rates(self, model: str, litellm: Any) -> tuple[float, float] | None:
        return group_rates(litellm, self.config.model_list, model)


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


_plan_environment = environment.reader(dict.fromkeys((*ROUTE_ENVIRONMENT, *keys.KEY_ENVIRONMENT)))
