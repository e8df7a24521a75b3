"""Everything this process learns about models and endpoints as it goes, in one place.

A model's window, how many characters its tokenizer reads per token, how long its
finished answers run, whether its provider streams or takes prompt-cache markers or a
JSON schema; what a local server says of its window; the pace an endpoint's rate limits
allow; what reported costs say of a model's price at an endpoint (``ReportedPrice``);
its tokenizer's loading, for counting answers under a budget. Each fact is learned once
(from an answer, an error, a probe or litellm's model info) and serves every later call
of the session. ``forget()`` forgets all of it at once, the rate gates' pauses and paces
included: after a server was restarted with other settings, or between tests, so that
nothing one test taught leaks into the next through a model's name.

Facts about a model (by its name, whichever endpoint serves it) are a ``ModelProfile``;
facts about a model at one endpoint (``RLM.api_base``, or a Router configuration) are an
``EndpointProfile``. Rate gates hold what they learned themselves (see ``ratelimit``)
and are kept here per event loop. (A gate also keeps a running estimate of characters
per token, for pacing a token limit before a response says what a prompt cost; the
model's own figure here, learned from usage reports of prompts large enough to say,
sizes windows and chunks. Both start from ``DEFAULT_CHARS_PER_TOKEN``.) The code that
learns a fact is the code that uses it (``windows``, ``local_servers``, ``client``...):
this module only keeps them.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import weakref
from dataclasses import dataclass, field
from typing import Any

# Characters per token until a model's usage reports say otherwise (English text, most
# tokenizers): every estimate of tokens from characters starts here.
DEFAULT_CHARS_PER_TOKEN = 4.0

# What a rate gate is known by: (model, endpoint, key id).
GateKey = tuple[str, str, str]


@dataclass
class ModelProfile:
    """What was learned about one model."""

    # litellm's model info: the input window, once asked (None: litellm has no entry).
    model_info_asked: bool = False
    model_info_window: int | None = None
    # Characters and tokens its usage reports (and the prompt counts in its refusals)
    # add up to: its characters per token.
    characters_read: float = 0.0
    tokens_counted: float = 0.0
    # The longest answer it finished by itself, in tokens (room to plan for answers).
    longest_answer: int = 0
    # Its provider refused a streamed request: it is not streamed for the rest of the
    # session.
    cannot_stream: bool = False
    # Its provider rejected prompt-cache markers: its prompts are sent plain.
    refuses_cache_markers: bool = False
    # Whether litellm says it takes a JSON schema, by the size of litellm's price map
    # when asked (a model registered later is asked again).
    schema_support: tuple[int, bool] | None = None
    # Whether its server takes one, whatever litellm says: True when the probe found a
    # server that does (llama.cpp, vLLM), False once the server refused one.
    server_takes_schema: bool | None = None
    # The user was told that its typed answers' schema is not sent (once).
    told_schema_not_sent: bool = False
    # Its tokenizer loading in a thread, once, for counting answers as they stream
    # under a budget (see ``budget``); thread-safe: a call on any loop may wait for it.
    tokenizer_loading: concurrent.futures.Future[None] | None = None


@dataclass
class ReportedPrice:
    """What the costs a model's calls reported at one endpoint (a LiteLLM Proxy's
    header) taught about its price, when litellm's price map has none: a fact of the
    endpoint, which prices the name its own way. Learned and read by ``budget``."""

    # Dollars per input and output token at most, from the reported costs.
    rates: tuple[float, float] | None = None
    # Resolved when the call sent while none had reported ends (thread-safe: a call on
    # any loop may wait for it).
    first: concurrent.futures.Future[None] | None = None
    # A call ended without a reported cost: the model's calls are not priced at all.
    unreported: bool = False


@dataclass
class EndpointProfile:
    """What was learned about one model at one endpoint."""

    # The window a context-length error named.
    window_from_error: int | None = None
    # The window the local server reported when asked (None: it did not say).
    server_asked: bool = False
    server_window: int | None = None
    # A guessed window (Ollama's default) and when it was guessed: advice only.
    window_guess: tuple[int, float] | None = None
    # The server being asked right now (one probe at a time).
    probe: asyncio.Future[Any] | None = None
    # What the probe found serving it ("llama.cpp", "vllm", "ollama"; None: it could not
    # tell), and how many requests that server runs at once, if it says (llama.cpp's
    # total_slots): see ``slots``.
    server_kind: str | None = None
    server_slots: int | None = None
    # Whether it is on this machine or the local network: only then are its own
    # endpoints asked (/slots, /metrics, /tokenize), as the probe's are.
    server_is_local: bool = False
    # What its calls' reported costs taught about its price (litellm has none).
    reported_price: ReportedPrice = field(default_factory=ReportedPrice)


@dataclass
class Profiles:
    models: dict[str, ModelProfile] = field(default_factory=dict)
    endpoints: dict[tuple[str | None, str], EndpointProfile] = field(default_factory=dict)
    # The rate gates of each event loop (their waiters are futures of that loop), by
    # (model, endpoint, key id): see ``ratelimit.gate_for``.
    gates: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[GateKey, Any]] = field(
        default_factory=weakref.WeakKeyDictionary
    )
    # The slot holds of each event loop, by endpoint (one server's slots serve every
    # model name it is asked by): see ``slots``.
    slot_holds: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[str, Any]] = field(
        default_factory=weakref.WeakKeyDictionary
    )
    # Moves on every ``forget``: what was built from these facts (a model's call plan,
    # holding its gate) is built again.
    generation: int = 0

    def model(self, name: str) -> ModelProfile:
        """The profile of model ``name``, made empty on first use."""
        profile = self.models.get(name)
        if profile is None:
            profile = self.models[name] = ModelProfile()
        return profile

    def known_model(self, name: str | None) -> ModelProfile | None:
        """The profile of model ``name`` if anything was learned about it (reading
        makes no entry)."""
        return self.models.get(name) if name else None

    def at(self, endpoint: str | None, model: str) -> EndpointProfile:
        """The profile of ``model`` at ``endpoint``, made empty on first use."""
        key = (endpoint, model)
        profile = self.endpoints.get(key)
        if profile is None:
            profile = self.endpoints[key] = EndpointProfile()
        return profile

    def known_at(self, endpoint: str | None, model: str) -> EndpointProfile | None:
        return self.endpoints.get((endpoint, model))

    def reported_price(self, endpoint: str | None, model: str) -> ReportedPrice:
        """What reported costs taught of ``model``'s price at ``endpoint``."""
        return self.at(endpoint, model).reported_price

    def forget(self) -> None:
        self.models.clear()
        self.endpoints.clear()
        self.gates.clear()
        self.slot_holds.clear()
        self.generation += 1


PROFILES = Profiles()


def forget() -> None:
    """Forget everything learned about models and endpoints (a restarted server; tests)."""
    PROFILES.forget()
