"""One limit (requests or tokens per second) mirrored on our side as a bucket, its rate
learned from headers or probed from 429s (see the package's docstring)."""

from __future__ import annotations

import time

from .headers import Reading

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
# A 429 whose retry-after-ms is under this share of the request's own turn at the pace
# came a moment early (its send raced the one before): no evidence against the rate.
EARLY_SHARE = 0.25
# A server that refuses while its headers say there is room enforces a smaller burst than
# the budget they announce (OpenAI's minute, enforced over a second or less): this many
# seconds of the rate at once.
BURST_S = 1.0


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
        self.burst: float | None = None  # the most at once, when less than the headers' limit
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
            self.capacity = max(1.0, min(reading.limit, self.burst or reading.limit))
        if reading.remaining is not None and self.rate:
            # The server's count is a latency old and misses our later starts, so it
            # only ever lowers ours (another client may share the quota).
            if self.stamp <= now:
                self.level = min(self.capacity, self.level + (now - self.stamp) * self.rate)
                self.stamp = now
            self.level = min(self.level, reading.remaining)

    def probe(self, rate: float, now: float) -> None:
        """Raise a blind rate a little, in proportion to the time since the last raise.
        ``rate`` is the pacer's own (the gate probes only a limit that has one)."""
        growth = SLOW_START_GROWTH if self.slow_start else STEADY_GROWTH
        if self.distrusted and self.knee and rate >= self.knee:
            growth = KNEE_GROWTH
        elapsed = min(1.0, max(0.0, now - self.grown_at))
        self.grown_at = now
        rate = rate * (1 + growth * elapsed)
        if self.distrusted and self.header_rate:
            rate = min(rate, self.header_rate)
        rate = self.set_rate(rate)
        self.capacity = max(1.0, rate * 0.1)  # blind: bursts of a tenth of a second

    def contradicted(
        self,
        rate: float,
        accepted: float,
        now: float,
        bound: float | None = None,
        at_once: bool = False,
    ) -> None:
        """A 429 although we paced to the headers' rate (``rate``, the pacer's own): after
        ``CONTRADICTIONS`` of them (or ``at_once``), pace by ``accepted`` (what the server
        took per second) instead, at most ``bound`` (the refill a retry-after-ms implies)."""
        self.contradictions += 1
        if not (self.distrusted or at_once or self.contradictions >= CONTRADICTIONS):
            return
        if not self.distrusted:
            self.distrusted, self.header_rate = True, rate
        start = accepted if accepted > 0 else (bound or rate * RATE_DECREASE)
        if bound:
            start = min(start, bound)
        self.knee = start
        rate = self.set_rate(min(start, rate) * ACCEPTED_SHARE)
        self.capacity = max(1.0, rate * 0.1)
        self.level = min(self.level, self.capacity)
        self.grown_at = self.learned_at = now
        self.booked_rate = rate

    @property
    def probed(self) -> bool:
        """The rate is our guess, raised while answers come: blind, or headers distrusted."""
        return self.blind or self.distrusted

    def set_rate(self, rate: float) -> float:
        """Pace at ``rate`` (within the user's ceiling); returns the rate now paced at."""
        if self.ceiling:
            rate = min(rate, self.ceiling)
        self.rate = rate = max(rate, 0.01)
        self.capacity = max(1.0, min(self.capacity or rate, rate))
        self.level = min(self.level, self.capacity)
        return rate


def _smooth(old: float | None, new: float, weight: float = 0.3) -> float:
    return new if old is None else (1 - weight) * old + weight * new
