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
- **adapts its concurrency** with additive increase and multiplicative decrease, never
  below what the learned rate needs to stay busy;
- **believes 429s over headers.** Limits may be quantized: OpenAI may enforce 60,000
  requests a minute as 1,000 a second, Azure its RPM over 1 s or 10 s windows, while the
  headers announce the minute's budget. When 429s keep coming although the headers'
  rate says there is room, that limit is paced by what the server accepted in the last
  second instead, probed upwards slowly, and the headers' rate is only its ceiling.

Independent retries with jitter turn a 429 into a storm (every waiting item wakes and
collides again); one shared schedule does not. Gates live per event loop, since their
waiters are futures of that loop: in a kernel that is one set for the whole session.
"""

from __future__ import annotations

import asyncio
import hashlib
import math
import re
import time
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..errors import RateLimitWaitExceeded
from .limiter import ConcurrencyLimiter
from .profiles import DEFAULT_CHARS_PER_TOKEN, PROFILES

# Without a retry-after, the first pause lasts this long and doubles while 429s go on.
FIRST_BLIND_PAUSE_S = 0.5
MAX_BLIND_PAUSE_S = 30.0
# Without headers the rate is probed as TCP probes a link: it doubles every second
# until the first 429 ("slow start"), then grows 10% a second; a 429 cuts it to 70%.
RATE_DECREASE = 0.7
SLOW_START_GROWTH = 1.0
STEADY_GROWTH = 0.1
# Headers contradicted by this many 429s (each after pacing to them) are not believed.
CONTRADICTIONS = 2
# A 429 whose retry-after-ms implies a refill this many times slower than the headers'
# rate (which would refill the request in a moment) shows a quantized limit at once.
QUANTIZED_FACTOR = 4.0
# Past the pace at which the server last refused, a distrusted rate grows this slowly.
KNEE_GROWTH = 0.01
# A limit paced by what got through: this share of what the server accepted per second
# since it first refused (its bucket was empty then: what it took since is its refill).
ACCEPTED_SHARE = 0.95


@dataclass
class Reading:
    """What one response's headers say about a limit."""

    limit: float | None = None
    remaining: float | None = None
    reset_s: float | None = None

    @property
    def rate(self) -> float | None:
        """Refill per second: what was used, over the time until it is full again.

        ``remaining`` is rounded down by providers, hence the half unit; a nearly
        full bucket says too little to learn from (one unit of rounding would be a
        large error), and is not when pacing matters anyway."""
        if self.limit is None or self.remaining is None or not self.reset_s:
            return None
        deficit = self.limit - self.remaining
        if deficit < max(2.0, min(20.0, self.limit / 2)):
            return None
        return (deficit - 0.5) / self.reset_s


@dataclass
class Headers:
    requests: Reading
    tokens: Reading
    retry_after_s: float | None
    retry_after_exact: bool = False  # from ``retry-after-ms``, not whole seconds

    @property
    def any_limits(self) -> bool:
        return any(
            v is not None for r in (self.requests, self.tokens) for v in (r.limit, r.remaining)
        )


_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ms|h|m|s)")
_UNIT_S = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 0.001}


def parse_duration(text: str | None) -> float | None:
    """Seconds from '1s', '6m0s', '120ms', '0.5' (OpenAI) or an RFC 3339 time
    (Anthropic's ``*-reset``); None when it is neither."""
    if text is None:
        return None
    text = str(text).strip()
    try:
        return max(0.0, float(text))
    except ValueError:
        pass
    parts = _DURATION.findall(text)
    if parts and "".join(n + u for n, u in parts) == text:
        return sum(float(n) * _UNIT_S[u] for n, u in parts)
    try:
        from datetime import datetime, timezone

        moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
        return max(0.0, (moment - datetime.now(timezone.utc)).total_seconds())
    except ValueError:
        return None


def non_negative(value: Any) -> float | None:
    """A header's number, or None when it is missing, not a number, NaN or negative."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if number >= 0 else None  # (NaN >= 0 is False)


def read_headers(headers: Mapping[str, Any] | None) -> Headers:
    """The rate-limit facts in a response's headers, in OpenAI's or Anthropic's
    spelling, with or without litellm's ``llm_provider-`` prefix."""
    found: dict[str, Any] = {}
    for key, value in (headers or {}).items():
        key = str(key).lower()
        if "rate" in key or "retry" in key:  # (every answer passes here: skip the rest)
            found[key.removeprefix("llm_provider-")] = value
    if not found:
        return Headers(Reading(), Reading(), None)

    def reading(kind: str, anthropic: str) -> Reading:
        get = found.get

        def either(field: str):
            return get(
                f"x-ratelimit-{field}-{kind}", get(f"anthropic-ratelimit-{anthropic}-{field}")
            )

        return Reading(
            non_negative(either("limit")),
            non_negative(either("remaining")),
            parse_duration(either("reset")),
        )

    retry_after = None
    if "retry-after-ms" in found:
        ms = non_negative(found["retry-after-ms"])
        retry_after = ms / 1000 if ms is not None else None
    if retry_after is None and "retry-after" in found:
        retry_after = parse_duration(found["retry-after"])
        if retry_after is None:  # an HTTP date
            from email.utils import parsedate_to_datetime

            try:
                retry_after = max(
                    0.0, parsedate_to_datetime(found["retry-after"]).timestamp() - time.time()
                )
            except (TypeError, ValueError):
                retry_after = None
    return Headers(
        reading("requests", "requests"),
        reading("tokens", "input-tokens"),
        retry_after,
        "retry-after-ms" in found and retry_after is not None,
    )


class Pacer:
    """One limit (requests or tokens) as a bucket we mirror on our side.

    ``level`` is what the bucket holds at ``stamp``; reservations may take it below
    zero, and a reservation's start time is when the refill pays that debt back.
    """

    def __init__(
        self, rate: float | None = None, capacity: float | None = None, ceiling: float | None = None
    ):
        self.rate = rate  # units per second; None: no known limit
        self.capacity = capacity or (rate or 0.0)
        self.ceiling = ceiling  # the user's explicit setting: learning never goes past it
        self.blind = False  # the rate is a guess from 429s alone, probed upwards
        # Headers the server's 429s contradicted (a quantized limit): their rate is only
        # a ceiling; the pace follows what was accepted, probed upwards.
        self.distrusted = False
        self.header_rate: float | None = None
        self.learned_at = 0.0  # when a header last set the rate
        self.contradictions = 0
        self.booked_rate = 0.0  # the probed pace the current bookings were made at
        self.knee: float | None = None  # what the server accepted when it last refused
        self.slow_start = False
        self.grown_at = 0.0
        self.level = self.capacity
        self.stamp = time.monotonic()

    def reserve(self, amount: float, at: float) -> float:
        """Book ``amount`` at or after time ``at``; returns when it may start."""
        if not self.rate:
            return at
        at = max(at, self.stamp)
        self.level = min(self.capacity, self.level + (at - self.stamp) * self.rate)
        self.stamp = at
        self.level -= amount
        return at + max(0.0, -self.level) / self.rate

    def drain(self, until: float) -> None:
        """The server said the bucket is empty: nothing is available before ``until``."""
        self.level, self.stamp = 0.0, max(self.stamp, until)

    def refund(self, amount: float) -> None:
        self.level = min(self.capacity, self.level + amount) if self.rate else self.level

    def learn(self, reading: Reading, now: float) -> None:
        rate = reading.rate
        if rate is not None and self.distrusted:
            self.header_rate = _smooth(self.header_rate, rate)  # a ceiling, no more
        elif rate is not None:
            rate = min(rate, self.ceiling) if self.ceiling else rate
            if self.blind:
                self.rate, self.blind = None, False
            # Smoothed: single readings are coarse (rounded counts, millisecond resets).
            self.rate = rate if self.rate is None else 0.7 * self.rate + 0.3 * rate
            self.learned_at = now
        if reading.limit is not None and self.rate and not self.distrusted:
            self.capacity = max(1.0, reading.limit)
        if reading.remaining is not None and self.rate:
            # The server's count is a latency old and misses our later starts, so it
            # only ever lowers ours (another client may share the quota).
            if self.stamp <= now:
                self.level = min(self.capacity, self.level + (now - self.stamp) * self.rate)
                self.stamp = now
            self.level = min(self.level, reading.remaining)

    def probe(self, now: float) -> None:
        """Raise a blind rate a little, in proportion to the time since the last raise."""
        growth = SLOW_START_GROWTH if self.slow_start else STEADY_GROWTH
        if self.distrusted and self.knee and self.rate >= self.knee:
            growth = KNEE_GROWTH
        elapsed = min(1.0, max(0.0, now - self.grown_at))
        self.grown_at = now
        rate = self.rate * (1 + growth * elapsed)
        if self.distrusted and self.header_rate:
            rate = min(rate, self.header_rate)
        self.set_rate(rate)
        self.capacity = max(1.0, self.rate * 0.1)  # blind: bursts of a tenth of a second

    def contradicted(
        self, accepted: float, now: float, bound: float | None = None, at_once: bool = False
    ) -> None:
        """A 429 although we paced to the headers' rate: after ``CONTRADICTIONS`` of
        them (or ``at_once``), pace by ``accepted`` (what the server took per second)
        instead, at most ``bound`` (the refill a retry-after-ms implies)."""
        self.contradictions += 1
        if not (self.distrusted or at_once or self.contradictions >= CONTRADICTIONS):
            return
        if not self.distrusted:
            self.distrusted, self.header_rate = True, self.rate
        start = accepted if accepted > 0 else (bound or self.rate * RATE_DECREASE)
        if bound:
            start = min(start, bound)
        self.knee = start
        self.set_rate(min(start, self.rate) * ACCEPTED_SHARE)
        self.capacity = max(1.0, self.rate * 0.1)
        self.level = min(self.level, self.capacity)
        self.grown_at = self.learned_at = now
        self.booked_rate = self.rate

    @property
    def probed(self) -> bool:
        """The rate is our guess, raised while answers come: blind, or headers distrusted."""
        return self.blind or self.distrusted

    def set_rate(self, rate: float) -> None:
        if self.ceiling:
            rate = min(rate, self.ceiling)
        self.rate = max(rate, 0.01)
        self.capacity = max(1.0, min(self.capacity or self.rate, self.rate))
        self.level = min(self.level, self.capacity)


@dataclass
class Ticket:
    """One request's passage through the gate."""

    tokens: float
    sent_at: float = 0.0
    epoch: int = 0
    rejected: bool = False  # answered with a 429


class RateGate:
    """Every request to one provider endpoint passes here: see the module docstring."""

    def __init__(
        self,
        name: str,
        rpm: float | None = None,
        tpm: float | None = None,
        learns_from_headers: bool = True,
    ):
        self.name = name
        self.learns_from_headers = learns_from_headers
        self.requests = Pacer(rpm / 60 if rpm else None, ceiling=rpm / 60 if rpm else None)
        self.tokens = Pacer(tpm / 60 if tpm else None, ceiling=tpm / 60 if tpm else None)
        self.paused_until = 0.0
        self.epoch = 0  # bumped by each pause: bookings made before it are void
        self.cap: float | None = None  # adaptive concurrency; None: not limited here
        self.slots = ConcurrencyLimiter(
            lambda: 1 << 30 if self.cap is None else max(1, int(self.cap))
        )
        self.waiting = 0
        self.rate_limited = 0  # 429s seen by this gate
        self.chars_per_token = DEFAULT_CHARS_PER_TOKEN
        self.latency_s: float | None = None
        self._blind_pause = FIRST_BLIND_PAUSE_S
        self._last_decrease = 0.0
        self._sent: deque[float] = deque(maxlen=512)  # send times of recent answers
        self._started: deque[Ticket] = deque(maxlen=4096)  # recent requests sent
        self._first_refusal: float | None = None
        self._sleepers: set[asyncio.Future] = set()

    # -- settings ----------------------------------------------------------------------
    def configure(self, rpm: float | None, tpm: float | None) -> None:
        """Apply the user's ``RLM.rpm`` / ``RLM.tpm`` (None: learn)."""
        for pacer, per_minute in ((self.requests, rpm), (self.tokens, tpm)):
            ceiling = per_minute / 60 if per_minute else None
            if ceiling != pacer.ceiling:
                pacer.ceiling = ceiling
                if ceiling is not None:
                    pacer.set_rate(min(pacer.rate or ceiling, ceiling))

    def estimate_tokens(self, characters: int) -> float:
        return max(1.0, characters / self.chars_per_token)

    # -- passing ---------------------------------------------------------------------
    async def enter(self, tokens: float, deadline: float | None = None) -> Ticket:
        """Wait for this endpoint's pause, concurrency and pace; then the caller sends.

        ``deadline`` (monotonic) bounds the wait: past it, ``RateLimitWaitExceeded``.
        """
        await self.slots.acquire()
        booked, epoch = False, self.epoch
        try:
            while True:
                now = time.monotonic()
                epoch = self.epoch
                start = max(now, self.paused_until)
                start = max(
                    start, self.requests.reserve(1, start), self.tokens.reserve(tokens, start)
                )
                booked = True
                if deadline is not None and start > deadline:
                    raise RateLimitWaitExceeded(start - now)
                if start > now:
                    await self._sleep(start - now)
                # A pause that began while we waited voids our booking: book again.
                if self.epoch == epoch:
                    ticket = Ticket(tokens, time.monotonic(), epoch)
                    self._started.append(ticket)
                    return ticket
                booked = False  # the pause emptied the buckets, our booking with them
        except BaseException:
            # A booking given up (a cancel, a deadline) goes back: else the pace would
            # stay slowed by calls that were never sent, for the rest of the session.
            if booked and self.epoch == epoch:
                self.requests.refund(1)
                self.tokens.refund(tokens)
            self.slots.release()
            raise

    async def _sleep(self, seconds: float) -> None:
        """Sleep, or less: a new pause wakes every sleeper to book again at once."""
        loop = asyncio.get_running_loop()
        wake = loop.create_future()
        timer = loop.call_later(seconds, _set_done, wake)
        self._sleepers.add(wake)
        self.waiting += 1
        try:
            await wake
        finally:
            self.waiting -= 1
            timer.cancel()
            self._sleepers.discard(wake)

    def answered(
        self,
        ticket: Ticket,
        headers: Mapping[str, Any] | None,
        input_tokens: int | None,
        characters: int,
    ) -> None:
        """A response came back (not a 429): learn from it and free the slot."""
        self.slots.release()
        now = time.monotonic()
        self.latency_s = _smooth(self.latency_s, now - ticket.sent_at)
        found = read_headers(headers) if headers and self.learns_from_headers else None
        if found is not None and found.any_limits:
            self.requests.learn(found.requests, now)
            self.tokens.learn(found.tokens, now)
        self._sent.append(ticket.sent_at)  # what got through, should we learn blind
        for pacer in (self.requests, self.tokens):
            if pacer.probed and pacer.rate:
                pacer.probe(now)
                if pacer.rate > 1.25 * pacer.booked_rate:
                    self._rebook(now)
        if input_tokens:
            if characters:
                self.chars_per_token = _smooth(self.chars_per_token, characters / input_tokens, 0.2)
            self.tokens.refund(ticket.tokens - input_tokens)  # correct the estimate
        self._blind_pause = FIRST_BLIND_PAUSE_S
        if self.cap is not None and self.cap < 1 << 20:
            self.cap += 1 / max(self.cap, 1)  # additive increase: +1 per round of answers

    def failed(self, ticket: Ticket) -> None:
        """Any other failure: the request is over, nothing to learn."""
        self.slots.release()

    def rate_limited_by(self, ticket: Ticket, headers: Mapping[str, Any] | None) -> None:
        """The request got a 429: pause everybody, and slow down."""
        holding = self.slots.holders
        self.slots.release()
        self.rate_limited += 1
        ticket.rejected = True
        if self._first_refusal is None:
            self._first_refusal = time.monotonic()
        now = time.monotonic()
        found = read_headers(headers)
        if not self.learns_from_headers:
            found = Headers(Reading(), Reading(), found.retry_after_s)
        # The headers' pace was kept when this request went out, yet it was refused;
        # or the refusal's own retry-after-ms belies the headers' rate.
        refusing = self._refusing(found, ticket)
        contradicted = [
            (pacer, kind, None)
            for pacer, kind in refusing
            if pacer.rate
            and not pacer.blind
            and (pacer.distrusted or pacer.learned_at < ticket.sent_at)
        ]
        if found.retry_after_exact and found.retry_after_s:
            for pacer, kind in refusing:
                said = (found.requests if kind == "requests" else found.tokens).rate
                needed = 1.0 if kind == "requests" else ticket.tokens
                implied = needed / found.retry_after_s
                if said and said > QUANTIZED_FACTOR * implied and not pacer.distrusted:
                    contradicted = [c for c in contradicted if c[0] is not pacer]
                    contradicted.append((pacer, kind, implied))
        if found.any_limits:
            self.requests.learn(found.requests, now)
            self.tokens.learn(found.tokens, now)
        # One slow-down per burst: 429s for requests sent before the last one are
        # echoes of the same overload, not news.
        news = ticket.sent_at >= self._last_decrease
        wait = found.retry_after_s
        if wait is None and news:
            if self.requests.rate:  # pacing will slow us down; a moment's pause is enough
                wait = 1 / self.requests.rate
            else:
                wait = self._blind_pause
                self._blind_pause = min(self._blind_pause * 2, MAX_BLIND_PAUSE_S)
        until = now + (wait or 0.0)
        if until > self.paused_until:
            self.paused_until = until
            self.epoch += 1
            # Empty on the server: whatever we thought was available was not.
            binding = [p for p in (self.requests, self.tokens) if p.rate]
            for pacer in binding or [self.requests]:
                pacer.drain(until)
            for sleeper in self._sleepers:  # their bookings are void: book again now
                _set_done(sleeper)
        if news:
            self._last_decrease = now
            if not found.any_limits:
                self._learn_blind(now)
            for pacer, kind, implied in contradicted:
                if pacer.rate:
                    pacer.contradicted(
                        self._accepted(kind, now), now, implied, at_once=implied is not None
                    )
            self.cap = max(self._needed_concurrency(), holding / 2, 1.0)

    def _refusing(self, found: Headers, ticket: Ticket) -> list[tuple[Pacer, str]]:
        """The limits that refused a request: those whose headers say they ran out
        (else any the headers pace)."""
        refusing = []
        if found.requests.remaining is not None and found.requests.remaining < 1:
            refusing.append((self.requests, "requests"))
        if found.tokens.remaining is not None and found.tokens.remaining < ticket.tokens:
            refusing.append((self.tokens, "tokens"))
        return refusing or [(self.requests, "requests"), (self.tokens, "tokens")]

    def _accepted(self, kind: str, now: float) -> float:
        """Requests (or their tokens) per second the server accepted over the last two
        seconds, counted from its first refusal: before it, a full bucket's burst would
        pass for a rate. Too short a stretch: the last second's, burst and all."""
        since = max(now - 2.0, self._first_refusal or now)
        if now - since < 0.2:
            since = now - 1.0
        taken = [t for t in self._started if t.sent_at > since and not t.rejected]
        amount = float(len(taken)) if kind == "requests" else sum(t.tokens for t in taken)
        return amount / max(now - since, 0.2) if now - since >= 0.2 else amount

    def _rebook(self, now: float) -> None:
        """The pace went up: bookings made at the old one would start too late, so
        every sleeper books again (in the order they wake, which is their order)."""
        for pacer in (self.requests, self.tokens):
            if pacer.probed and pacer.rate:
                pacer.booked_rate = pacer.rate
        self.epoch += 1
        for pacer in (self.requests, self.tokens):
            if pacer.probed and pacer.rate:
                pacer.level, pacer.stamp = 0.0, now
        for sleeper in self._sleepers:
            _set_done(sleeper)

    def _learn_blind(self, now: float) -> None:
        """No headers: start from what got through in the last second (less a
        margin) and probe upwards, or cut the rate we are probing at."""
        pacer = self.requests
        recent = sum(1 for t in self._sent if t > now - 1.0)
        if pacer.rate:
            pacer.set_rate(pacer.rate * RATE_DECREASE)
            pacer.slow_start = False
        elif recent:
            pacer.set_rate(max(1.0, recent * RATE_DECREASE))
            pacer.slow_start = True
        else:
            return  # nothing got through yet to learn from: the pause and the cap act
        pacer.blind, pacer.grown_at, pacer.booked_rate = True, now, pacer.rate

    def _needed_concurrency(self) -> float:
        """Little's law: the requests in flight that the known rate keeps busy."""
        if self.requests.rate and self.latency_s:
            return math.ceil(self.requests.rate * self.latency_s * 1.5) + 1
        return 1.0

    # -- what a progress line shows ----------------------------------------------------
    def hold_message(self) -> str | None:
        """'rate limited: resuming in 3 s' while paused, a pace while pacing, else None."""
        left = self.paused_until - time.monotonic()
        if left > 0:
            return f"rate limited: resuming in {math.ceil(left)} s"
        if self.waiting and self.requests.rate:
            return f"paced to {self.requests.rate * 60:,.0f} requests/min"
        if self.waiting and self.tokens.rate:
            return f"paced to {self.tokens.rate * 60:,.0f} tokens/min"
        return None


def _set_done(future: asyncio.Future) -> None:
    if not future.done():
        future.set_result(None)


def _smooth(old: float | None, new: float, weight: float = 0.3) -> float:
    return new if old is None else (1 - weight) * old + weight * new


# -- the gates of this process ---------------------------------------------------------------


def gate_for(
    model: str,
    api_base: str | None,
    api_key: str | None,
    rpm: float | None = None,
    tpm: float | None = None,
    *,
    learns_from_headers: bool = True,
) -> RateGate:
    """The gate of one provider endpoint on the running loop. Limits belong to an
    account, so the key is part of the name (hashed: gates are listed in diagnostics)."""
    loop = asyncio.get_running_loop()
    key_id = hashlib.sha256(api_key.encode()).hexdigest()[:8] if api_key else ""
    name = (model, api_base or "", key_id)
    gates = PROFILES.gates.setdefault(loop, {})
    gate = gates.get(name)
    if gate is None:
        gate = gates[name] = RateGate(model, rpm, tpm, learns_from_headers)
    gate.configure(rpm, tpm)
    return gate


def gates() -> list[RateGate]:
    """Every gate of the running loop (for status lines and tests)."""
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        return []
    return list(PROFILES.gates.get(loop, {}).values())


def hold_message() -> str | None:
    """What holds calls back on this loop, if anything: a pause before a pace."""
    messages = [m for m in (g.hold_message() for g in gates()) if m]
    messages.sort(key=lambda m: not m.startswith("rate limited"))
    return messages[0] if messages else None


def is_rate_limit(exc: BaseException) -> bool:
    """An HTTP 429, or a provider's rate-limit error as litellm maps it."""
    return getattr(exc, "status_code", None) == 429 or type(exc).__name__ == "RateLimitError"


def headers_of(exc: BaseException) -> Mapping[str, Any] | None:
    """The response headers a litellm error carries, if any."""
    headers = getattr(exc, "litellm_response_headers", None)
    if headers is None:
        headers = getattr(getattr(exc, "response", None), "headers", None)
    return headers
