"""Provider rate limits: one gate per provider endpoint, shared by every call.

A provider limits requests and tokens per minute for an account, not per batch. So
the notebook's batches, an RLM's root and sub-calls and its child runs all pass one
``RateGate`` per (model, endpoint, key), which

- **pauses everybody** when one request is rate limited: new requests hold back until
  the server's ``retry-after-ms`` / ``retry-after``; requests in flight are left alone;
- **paces** request starts to the sustainable rate, in requests and in tokens. The rate
  is learned from ``x-ratelimit-limit/remaining/reset-*`` headers when the provider
  sends them (limit minus remaining, over the time to reset), from the 429s when it
  does not, or set by ``RLM.rpm`` / ``RLM.tpm``. Pacing reserves start times, like
  GCRA: each request books the next free moment, so waiters start in order and after a
  pause resume one interval apart instead of all at once;
- **counts tokens as the server does**: our estimate of a prompt (4 characters a token)
  is booked times what the server's usage reports showed it counts per token of that
  estimate (another tokenizer, a chat template), learned per gate from the first answer,
  or earlier from the first refusal that says what the request counted (OpenAI's "...
  Requested 3000") or whose token budget headers show what left it; until then, a
  refusal on tokens may be our miscount and is not held against headers;
- **waits a refill, not a rounded second**: a ``retry-after`` in whole seconds (or an
  HTTP date) under a rate known from headers pauses for this request's refill at that
  rate, within the server's figure (a second's pause after each refusal held a
  token-limited batch to 1.3-1.4x its floor);
- **adapts its concurrency** with additive increase and multiplicative decrease, never
  below what the learned rate needs to stay busy at the measured latency; where a token
  limit binds (its rate known from headers), a 429 does not halve it: the token pace
  answers the 429, and a halved cap held such a batch to half the accepted rate when
  answers took long;
- **believes 429s over headers.** Limits may be quantized: OpenAI may enforce 60,000
  requests a minute as 1,000 a second, Azure its RPM over 1 s or 10 s windows, while the
  headers announce the minute's budget. When 429s keep coming although the headers'
  rate says there is room, that limit is paced by what the server accepted in the last
  second instead, probed upwards slowly, and the headers' rate is only its ceiling.
  Not every 429 is such news: one a few milliseconds of refill short (a send that raced
  the one before) says nothing against the rate; one while the headers' ``remaining``
  had room (OpenAI's headers speak of the minute's budget) shows that a smaller burst is
  enforced, and that limit's bucket holds a second of its rate at most.

Independent retries with jitter turn a 429 into a storm (every waiting item wakes and
collides again); one shared schedule does not. Gates live per event loop, since their
waiters are futures of that loop: in a kernel that is one set for the whole session.
"""

from __future__ import annotations

from .gate import RateGate, Ticket, gate_for, gates, hold_message
from .headers import (
    Headers,
    Reading,
    headers_of,
    is_rate_limit,
    non_negative,
    parse_duration,
    read_headers,
    requested_tokens,
)
from .pacer import Pacer

__all__ = [
    "Headers",
    "Pacer",
    "RateGate",
    "Reading",
    "Ticket",
    "gate_for",
    "gates",
    "headers_of",
    "hold_message",
    "is_rate_limit",
    "non_negative",
    "parse_duration",
    "read_headers",
    "requested_tokens",
]
