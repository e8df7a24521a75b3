"""The gate every request to one provider endpoint passes (see the package's docstring),
and the gates of this process: one per (model, endpoint, key) and event loop.

Why one module: what a 429 or an answer teaches is read against the same
bookings, pause and concurrency (which limit refused, whether the headers or our count
were wrong, how much was accepted), so the reading stays beside the booking."""

from __future__ import annotations

import asyncio
import functools
import hashlib
import math
import time
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ...errors import RateLimitWaitExceeded
from ..limiter import ConcurrencyLimiter
from ..profiles import DEFAULT_CHARS_PER_TOKEN, PROFILES
from .headers import Headers, Reading, read_headers, requested_tokens
from .pacer import (
    BURST_S,
    EARLY_SHARE,
    FIRST_BLIND_PAUSE_S,
    MAX_BLIND_PAUSE_S,
    QUANTIZED_FACTOR,
    RATE_DECREASE,
    Pacer,
    _smooth,
)


@dataclass
class Ticket:
    """One request's passage through the gate."""

    tokens: float  # booked: our estimate, as the server was learned to count it
    sent_at: float = 0.0
    epoch: int = 0
    rejected: bool = False  # answered with a 429
    estimate: float = 0.0  # our own estimate (0: ``tokens``)
    # Booked once the server's count was known (an answer had come back, or a refusal
    # said what it counted): until then a 429 may be our miscount, not a limit
    # stricter than its headers say.
    counted: bool = True


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
        # The server's count of a prompt's tokens per token of our estimate, learned from
        # the usage it reports (another tokenizer, a chat template): tokens are booked
        # as the server counts them, else a token limit is paced too fast or too slow.
        self.count_ratio = 1.0
        self._counted = self._estimated = 0.0
        self._request_tokens: float | None = None  # tokens a request books, smoothed
        # The server's count is known: an answer came back (with its usage, if it reports
        # any), or a refusal said what the request counted.
        self._count_known = False
        self.latency_s: float | None = None
        self._blind_pause = FIRST_BLIND_PAUSE_S
        self._last_decrease = 0.0
        self._sent: deque[float] = deque(maxlen=512)  # send times of recent answers
        self._started: deque[Ticket] = deque(maxlen=4096)  # recent requests sent
        self._first_refusal: float | None = None
        self._sleepers: set[asyncio.Future[None]] = set()

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
        """Our estimate of a prompt's tokens; ``enter`` books it as the server counts."""
        return max(1.0, characters / DEFAULT_CHARS_PER_TOKEN)

    @property
    def chars_per_token(self) -> float:
        """Characters per token as this server counts them (what was learned)."""
        return DEFAULT_CHARS_PER_TOKEN / self.count_ratio

    # -- passing ---------------------------------------------------------------------
    async def enter(self, tokens: float, deadline: float | None = None) -> Ticket:
        """Wait for this endpoint's pause, concurrency and pace; then the caller sends.

        ``tokens`` is our estimate; it is booked as the server counts (``count_ratio``,
        as learned by the time of each booking). ``deadline`` (monotonic) bounds the
        wait: past it, ``RateLimitWaitExceeded``.
        """
        await self.slots.acquire()
        booked, epoch, estimate = False, self.epoch, tokens
        try:
            while True:
                now = time.monotonic()
                epoch = self.epoch
                tokens = estimate * self.count_ratio
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
                    ticket = Ticket(
                        tokens,
                        time.monotonic(),
                        epoch,
                        estimate=estimate,
                        counted=self._count_known,
                    )
                    self._started.append(ticket)
                    self._request_tokens = _smooth(self._request_tokens, tokens, 0.1)
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
        """A response came back (not a 429): learn from it and free the slot.
        (``characters``: the prompt's, which ``ticket.estimate`` was made from.)"""
        self.slots.release()
        self._when_idle()
        now = time.monotonic()
        self.latency_s = _smooth(self.latency_s, now - ticket.sent_at)
        found = read_headers(headers) if headers and self.learns_from_headers else None
        if found is not None and found.any_limits:
            self.requests.learn(found.requests, now)
            self.tokens.learn(found.tokens, now)
        self._sent.append(ticket.sent_at)  # what got through, should we learn blind
        for pacer in (self.requests, self.tokens):
            if pacer.probed and pacer.rate:
                pacer.probe(pacer.rate, now)
                if pacer.rate > 1.25 * pacer.booked_rate:
                    self._rebook(now)
        self._count_known = True
        if input_tokens:
            self._learn_count(ticket, input_tokens)
            if ticket.epoch == self.epoch:  # (a pause since emptied the buckets: void)
                self.tokens.refund(ticket.tokens - input_tokens)  # correct the booking
        self._blind_pause = FIRST_BLIND_PAUSE_S
        if self.cap is not None and self.cap < 1 << 20:
            self.cap += 1 / max(self.cap, 1)  # additive increase: +1 per round of answers
            if self._token_bound():  # ... never below what its pace needs in flight
                self.cap = max(self.cap, self._needed_concurrency())

    def _learn_count(self, ticket: Ticket, input_tokens: int) -> None:
        """The server counted ``input_tokens`` for what we estimated: learn the ratio,
        weighted by size (a short prompt is mostly the chat template's few tokens)."""
        estimate = ticket.estimate or ticket.tokens
        if not 1 / 3 <= input_tokens / estimate <= 5:
            return  # not this prompt's count (a fixed or cached figure): chars/token 0.8-12
        if self._estimated > 200_000:  # recent prompts weigh most
            self._counted, self._estimated = self._counted / 2, self._estimated / 2
        self._counted += input_tokens
        self._estimated += estimate
        self.count_ratio = self._counted / self._estimated

    def _learn_count_from_refusal(self, ticket: Ticket, requested: int) -> None:
        """A refusal said what the request counted (OpenAI's "Requested 3000"): book as
        the server counts from now on, not a latency later when the first usage comes
        (a blind burst's refusals are retried at once). Only until usage is reported,
        which replaces it: OpenAI's figure counts ``max_tokens`` too."""
        estimate = ticket.estimate or ticket.tokens
        if self._estimated or not 1 / 3 <= requested / estimate <= 5:
            return  # usage already tells, or not this prompt's count
        self.count_ratio = requested / estimate
        self._count_known = True

    def _learn_count_from_budget(self, reading: Reading, refused: Ticket) -> None:
        """Before any answer or usage: the token budget's headers tell what the server
        counted of the requests it took so far (what left its budget, and the refill
        between the first request and this refused one, which it answered at once),
        against our estimate of those not refused. A rough count (a refusal on its way
        counts as taken until it arrives), but the blind burst's refusals would
        otherwise be followed by more, a latency long, from a server that counts 2-4x
        our estimate. The first usage replaces it."""
        if reading.limit is None or reading.remaining is None or not self._started:
            return
        rate = reading.rate or self.tokens.rate
        refill = (rate or 0.0) * max(0.0, refused.sent_at - self._started[0].sent_at)
        counted = reading.limit - reading.remaining + refill
        estimated = sum(t.estimate or t.tokens for t in self._started if not t.rejected)
        if estimated and 1 / 3 <= counted / estimated <= 5:
            self.count_ratio = counted / estimated

    def failed(self, ticket: Ticket) -> None:
        """Any other failure: the request is over, nothing to learn."""
        self.slots.release()
        self._when_idle()

    def _when_idle(self) -> None:
        """Nothing in flight: what was accepted since the last refusal stops counting
        (else an idle spell reads as a slow server when the next batch is refused)."""
        if not self.slots.holders and not self.waiting:
            self._first_refusal = None

    def rate_limited_by(
        self, ticket: Ticket, headers: Mapping[str, Any] | None, message: str | None = None
    ) -> None:
        """The request got a 429: pause everybody, and slow down. (``message``: the
        refusal's own sentence, which may say what the request counted.)"""
        requested = requested_tokens(message)
        if requested:
            self._learn_count_from_refusal(ticket, requested)
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
        if not self._count_known:
            self._learn_count_from_budget(found.tokens, ticket)
        refusing = self._refusing(found, ticket)
        contradicted = self._contradicted(found, refusing, ticket)
        if found.any_limits:
            self.requests.learn(found.requests, now)
            self.tokens.learn(found.tokens, now)
            capped = self._cap_bursts(found, ticket)
            contradicted = [c for c in contradicted if c[0] not in capped]
        # One slow-down per burst: 429s for requests sent before the last one are
        # echoes of the same overload, not news.
        news = ticket.sent_at >= self._last_decrease
        self._pause_after_refusal(found, refusing, ticket, news, now)
        if news:
            self._slow_down(found, contradicted, holding, now)

    def _contradicted(
        self, found: Headers, refusing: list[tuple[Pacer, str]], ticket: Ticket
    ) -> list[tuple[Pacer, str, float | None]]:
        """The limits this refusal proves wrong, each with the rate it implies (None:
        slow down by the usual step). The headers' pace was kept when this request went
        out, yet it was refused; or the refusal's own retry-after-ms belies the headers'
        rate. (Booked before we knew how the server counts tokens, a refusal may be our
        miscount: only a retry-after-ms far off the headers' rate says more.)"""
        contradicted: list[tuple[Pacer, str, float | None]] = [
            (pacer, kind, None)
            for pacer, kind in refusing
            if pacer.rate
            and not pacer.blind
            and (pacer.distrusted or pacer.learned_at < ticket.sent_at)
            and (kind == "requests" or ticket.counted)
            # (a probe past the server's rate is refused by a hair first: that counts)
            and (pacer.distrusted or not self._a_moment_early(found, pacer, kind, ticket))
        ]
        if found.retry_after_exact and found.retry_after_s:
            for pacer, kind in refusing:
                said = (found.requests if kind == "requests" else found.tokens).rate
                needed = 1.0 if kind == "requests" else ticket.tokens
                implied = needed / found.retry_after_s
                if said and said > QUANTIZED_FACTOR * implied and not pacer.distrusted:
                    contradicted = [c for c in contradicted if c[0] is not pacer]
                    contradicted.append((pacer, kind, implied))
        return contradicted

    def _pause_after_refusal(
        self,
        found: Headers,
        refusing: list[tuple[Pacer, str]],
        ticket: Ticket,
        news: bool,
        now: float,
    ) -> None:
        """Pause everybody for as long as the refusal says (or the refill we work out,
        or a blind pause that doubles), and void the bookings of those waiting."""
        wait = found.retry_after_s
        refill = None if found.retry_after_exact else self._refill_wait(wait, refusing, ticket)
        wait = wait if refill is None else refill
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
            # (A refill we worked out ourselves is from empty now: it pays this request.)
            binding = [p for p in (self.requests, self.tokens) if p.rate]
            for pacer in binding or [self.requests]:
                pacer.drain(until if refill is None else now)
            for sleeper in self._sleepers:  # their bookings are void: book again now
                _set_done(sleeper)

    def _slow_down(
        self,
        found: Headers,
        contradicted: list[tuple[Pacer, str, float | None]],
        holding: float,
        now: float,
    ) -> None:
        """The one slow-down of a burst: the contradicted paces lowered, and the
        concurrency cap cut to what was in flight (halved without a token limit)."""
        self._last_decrease = now
        if not found.any_limits:
            self._learn_blind(now)
        for pacer, kind, bound in contradicted:
            if pacer.rate:
                pacer.contradicted(
                    pacer.rate,
                    self._accepted(kind, now),
                    now,
                    bound,
                    at_once=bound is not None,
                )
        # Not halved under a known token limit: its pace answers the 429, and a cut
        # cap (before the latency is known) held a batch to half the rate the
        # server accepts when answers take long.
        kept = holding if self._token_bound() else holding / 2
        self.cap = max(self._needed_concurrency(), kept, 1.0)

    def _refusing(self, found: Headers, ticket: Ticket) -> list[tuple[Pacer, str]]:
        """The limits that refused a request: those whose headers say they ran out
        (else any the headers pace)."""
        refusing = []
        if found.requests.remaining is not None and found.requests.remaining < 1:
            refusing.append((self.requests, "requests"))
        if found.tokens.remaining is not None and found.tokens.remaining < ticket.tokens:
            refusing.append((self.tokens, "tokens"))
        return refusing or [(self.requests, "requests"), (self.tokens, "tokens")]

    def _refill_wait(
        self, retry_after: float | None, refusing: list[tuple[Pacer, str]], ticket: Ticket
    ) -> float | None:
        """A ``retry-after`` in whole seconds (or an HTTP date) rounds a refill of a few
        milliseconds up to a second, which everybody would wait out (1.3-1.4x the floor
        of a token-limited batch). Where the refusing limits' rates are known (headers),
        the pause is the refill of this request at those rates instead, within the
        server's figure; the pace does the rest. None: no rate known to work it out."""
        waits = []
        for pacer, kind in refusing:
            if not pacer.rate or pacer.blind:
                continue
            needed = 1.0 if kind == "requests" else self._counted_tokens(ticket)
            waits.append(needed / pacer.rate)
        if not retry_after or not waits:
            return None
        return min(retry_after, max(waits))

    def _counted_tokens(self, ticket: Ticket) -> float:
        """A request's tokens as the server counts them, as far as we know now."""
        return max(ticket.tokens, (ticket.estimate or ticket.tokens) * self.count_ratio)

    @staticmethod
    def _a_moment_early(found: Headers, pacer: Pacer, kind: str, ticket: Ticket) -> bool:
        """Refused for a few milliseconds of refill (``EARLY_SHARE`` of its turn)."""
        if not (found.retry_after_exact and found.retry_after_s is not None and pacer.rate):
            return False
        needed = 1.0 if kind == "requests" else ticket.tokens
        return found.retry_after_s < EARLY_SHARE * needed / pacer.rate

    def _cap_bursts(self, found: Headers, ticket: Ticket) -> list[Pacer]:
        """Refused while the headers' ``remaining`` had room for this request in every
        limit: the server enforces a smaller burst than the budget they announce (as
        OpenAI's minute budget). Each limit paced from headers is then held to
        ``BURST_S`` of its rate at once; returns the pacers so held (this refusal was
        their burst, not their rate)."""
        readings = (
            (self.requests, found.requests, 1.0),
            (self.tokens, found.tokens, ticket.tokens),
        )
        if all(r.remaining is None for _, r, _ in readings) or any(
            r.remaining is not None and r.remaining < needed for _, r, needed in readings
        ):
            return []
        capped = []
        for pacer, reading, needed in readings:
            if pacer.rate and reading.remaining is not None and pacer.burst is None:
                if not pacer.distrusted:
                    pacer.burst = max(needed, pacer.rate * BURST_S)
                    pacer.capacity = min(pacer.capacity, pacer.burst)
                    pacer.level = min(pacer.level, pacer.capacity)
                    capped.append(pacer)
        return capped

    def _accepted(self, kind: str, now: float) -> float:
        """Requests (or their tokens) per second the server accepted over the last two
        seconds, counted from its first refusal: before it, a full bucket's burst would
        pass for a rate. Too short a stretch: the last second's, burst and all."""
        since = max(now - 2.0, self._first_refusal or now)
        if now - since < 0.2:
            since = now - 1.0
        taken = [t for t in self._started if t.sent_at > since and not t.rejected]
        if kind == "requests":
            amount = float(len(taken))
        else:  # as the server counts them, as far as we know now
            amount = sum(t.estimate * self.count_ratio if t.estimate else t.tokens for t in taken)
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
            rate = pacer.set_rate(pacer.rate * RATE_DECREASE)
            pacer.slow_start = False
        elif recent:
            rate = pacer.set_rate(max(1.0, recent * RATE_DECREASE))
            pacer.slow_start = True
        else:
            return  # nothing got through yet to learn from: the pause and the cap act
        pacer.blind, pacer.grown_at, pacer.booked_rate = True, now, rate

    def _token_bound(self) -> bool:
        """A token limit paced from headers binds: at the usual request's size it allows
        fewer requests a second than the requests limit does (if there is one)."""
        tokens, size = self.tokens, self._request_tokens
        if not tokens.rate or tokens.blind or not size:
            return False
        return not self.requests.rate or tokens.rate / size < self.requests.rate

    def _needed_concurrency(self) -> float:
        """Little's law: the requests in flight that the known rates keep busy. A token
        limit counts as the requests per second its rate allows at the usual size: a
        cap that ignored it would pace a token-limited batch at the cap's rate instead
        (halved on each 429, it was half the rate the server accepts)."""
        if not self.latency_s:
            return 1.0
        per_second = []
        if self.requests.rate:
            per_second.append(self.requests.rate)
        if self.tokens.rate and self._request_tokens:
            per_second.append(self.tokens.rate / self._request_tokens)
        if not per_second:
            return 1.0
        return math.ceil(min(per_second) * self.latency_s * 1.5) + 1

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


def _set_done(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


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
    name = (model, api_base or "", _key_id(api_key) if api_key else "")
    gates = PROFILES.gates.get(loop)
    if gates is None:  # (setdefault would make a weak reference on every call)
        gates = PROFILES.gates[loop] = {}
    gate = gates.get(name)
    if gate is None:
        gate = gates[name] = RateGate(model, rpm, tpm, learns_from_headers)
    gate.configure(rpm, tpm)
    return gate


@functools.lru_cache(maxsize=64)
def _key_id(api_key: str) -> str:
    """A key's short hash, named in diagnostics instead of the key. Cached: every call
    passes ``gate_for``, and hashing took a few microseconds of each (the cache is
    keyed by the key, as its caller's configuration holds it, and never printed)."""
    return hashlib.sha256(api_key.encode()).hexdigest()[:8]


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
