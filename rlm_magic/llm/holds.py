"""What calls hold in their cost budgets: a budget (``CostBudget``), the dollars one
call holds in each of its budgets until its record lands (``Reservation``), and the
watch on its answer's stream (``Reservation.more``). Whether a call may be sent, and
what it holds, is ``budget``'s.

A call of a model not yet priced is held at a guess (see ``budget``): the calls that do
not fit beside it wait for it to land (``hold``) rather than be refused.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import warnings
from collections.abc import Callable, Iterable, Sequence

from ..errors import AnswerOverBudget, BudgetExceededError
from .profiles import ReportedPrice
from .reported_prices import learn
from .usage import CallRecord, UsageLedger
from .windows import dense_tokens


class CostBudget:
    """A limit in dollars on what one ledger (and the ledgers under it) records.

    ``limit``: dollars, or a function reading a setting (None: no limit now).
    ``setting``: its name, as errors say it (``max_cost_usd``)."""

    def __init__(
        self, ledger: UsageLedger, limit: float | Callable[[], float | None], setting: str
    ):
        self.ledger = ledger
        self._limit = limit
        self.setting = setting
        self.held = 0.0  # dollars the calls in flight hold
        self.warned_unpriced = False
        # Calls in flight held at a guess (a model not yet priced): each resolves when
        # its record lands and gives most of it back (thread-safe: any loop may wait).
        self.guesses: set[concurrent.futures.Future[None]] = set()

    @property
    def limit(self) -> float | None:
        return self._limit() if callable(self._limit) else self._limit

    def limit_by(self, limit: float | Callable[[], float | None]) -> None:
        """Read the limit from ``limit`` now: what is held and spent stays."""
        self._limit = limit

    def left(self) -> float:
        limit = self.limit
        return float("inf") if limit is None else limit - self.ledger.cost_usd - self.held

    def named(self) -> str:
        return f"{self.setting}=${self.limit:g}"

    def warn_unpriced(self, model: str) -> None:
        """Once per budget, before the first call it cannot price is sent."""
        if self.warned_unpriced:
            return
        self.warned_unpriced = True
        warnings.warn(
            f"{self.setting} is set, but litellm has no price for {model}: until a cost "
            "it reports says what it charges, its calls are held at the highest rates "
            "litellm prices any model at (one at a time when that does not fit), then at "
            "the rates its reported costs imply; if it reports none, they are sent while "
            "the budget has anything left, and counted as $0",
            RuntimeWarning,
            stacklevel=2,
        )


def budgets_of(ledger: UsageLedger | None) -> list[CostBudget]:
    """The budgets a call recorded in ``ledger`` is held to (those with a limit now)."""
    found = []
    while ledger is not None:
        budget: CostBudget | None = ledger.budget
        if budget is not None and budget.limit is not None:
            found.append(budget)
        ledger = ledger.parent
    return found


class Reservation:
    """Dollars one call holds in each of its budgets until its record lands. The
    stream of its answer is watched by it too (``first_limit``, ``more``)."""

    def __init__(
        self,
        budgets: Sequence[CostBudget],
        model: str,
        output_tokens: int = 0,
        output_rate: float = 0.0,
    ):
        self.budgets, self.model = budgets, model
        self.amount = 0.0
        self.released = False
        self.output_tokens, self.output_rate = output_tokens, output_rate
        # Counts streamed text as the ledger will record it (litellm's tokenizer), once
        # the answer passes first_limit.
        self.counter: Callable[[str], int] | None = None
        self._counted_chars = self._streamed_tokens = 0
        # No price in litellm's map: what its record reports teaches the model's price
        # at its endpoint (``landed``).
        self.learns: ReportedPrice | None = None
        # Held at a guess (its model not yet priced): resolved when it ends, which lets
        # the calls waiting for it go (``ReportedPrice.first``, ``CostBudget.guesses``).
        self.guess: concurrent.futures.Future[None] | None = None

    def grow(self, extra: float, why: str = "", not_sent: tuple[int, int] | None = None) -> None:
        """Hold ``extra`` dollars more in every budget, or raise ``BudgetExceededError``
        (holding nothing more) when one of them has not that much left."""
        if extra <= 0:
            return
        for budget in self.budgets:
            left = budget.left()
            if extra > left:
                raise BudgetExceededError(
                    self.model, self.amount + extra, left + self.amount, budget.named(),
                    why=why, not_sent=not_sent,
                )  # fmt: skip
        for budget in self.budgets:
            budget.held += extra
        self.amount += extra

    def claim_guess(self) -> concurrent.futures.Future[None]:
        """This call is to be held at a guess: what resolves when it ends."""
        if self.guess is None:
            self.guess = concurrent.futures.Future()
        return self.guess

    def hold_guess(self, extra: float, why: str) -> None:
        """Hold ``extra`` more (see ``grow``), a guess: the calls that do not fit beside
        it wait for it to land rather than be refused."""
        self.grow(extra, why)
        guess = self.claim_guess()
        for budget in self.budgets:
            budget.guesses.add(guess)

    def landed(self, record: CallRecord) -> None:
        """The call's record (before ``release``): a reported cost of a model litellm
        cannot price teaches its rates, for the holds of its next calls."""
        if self.learns is not None:
            learn(self.learns, record)

    def release(self) -> None:
        """The call's record has landed (or it never went): give the hold back."""
        if not self.released:
            self.released = True
            for budget in self.budgets:
                budget.held -= self.amount
        guess = self.guess
        if guess is not None and not guess.done():
            for budget in self.budgets:
                budget.guesses.discard(guess)
            guess.set_result(None)  # the calls waiting for it may go

    # -- the answer's stream -------------------------------------------------------------
    def first_limit(self) -> int:
        """Characters of answer after which it is counted: as many as tokens are held
        (at worst a token a character: digits, CJK), so a dense answer is caught early;
        a few counts of new text follow as an ordinary one grows."""
        return self.output_tokens

    def more(self, text: str) -> int:
        """The answer streamed past ``first_limit`` (a server that ignores max_tokens, or
        text denser in tokens than usual): count it as it will be recorded, hold what it
        takes plus a quarter more, and return the characters after which to count again;
        raise ``AnswerOverBudget`` when no budget has room (the client then cuts the
        answer, keeping its text). Counted a piece at a time: each character once."""
        new = text[self._counted_chars :]
        self._counted_chars = len(text)
        self._streamed_tokens += self._count(new) + 1  # +1: a token split between pieces
        room = self.output_tokens - self._streamed_tokens
        if room < 0:  # past its hold: an answer that ends at max_tokens never is
            extra = -room + max(self.output_tokens // 4, 16)
            try:
                self.grow(extra * self.output_rate)
            except BudgetExceededError as refused:
                raise AnswerOverBudget(
                    f"cut at ~{self._streamed_tokens:,} tokens: the answer ran past the "
                    f"{self.output_tokens:,} held for it and {refused.budget} has no room "
                    "for more"
                ) from None
            self.output_tokens += extra
            room = self.output_tokens - self._streamed_tokens
        # At worst a token a character (digits, CJK) until the next count.
        return len(text) + max(room, 16)

    def _count(self, text: str) -> int:
        counter = self.counter
        if counter is not None:
            try:
                return int(counter(text))
            except Exception:  # noqa: BLE001 - no tokenizer: the estimate
                pass
        # Not the bytes bound (an ordinary answer within max_tokens would be cut), nor
        # the plain estimate (digits and CJK, a token a character, ran 4x past it).
        return max(1, dense_tokens(text, self.model))


async def hold_or_wait(
    reservation: Reservation, most: float, why: str, not_sent: tuple[int, int] | None = None
) -> None:
    """Hold ``most`` in all of ``reservation``'s budgets; when it does not fit while
    other calls are held at a guess, wait for one of them to land (it gives most of its
    guess back) and try again. Raises ``BudgetExceededError`` when none is left to wait
    for."""
    while True:
        try:
            reservation.grow(most - reservation.amount, why, not_sent)
            return
        except BudgetExceededError:
            guesses = guesses_but(reservation.budgets, but=reservation.guess)
            if not guesses:
                raise
        await first_done(guesses)


def guesses_but(
    budgets: Iterable[CostBudget], but: concurrent.futures.Future[None] | None = None
) -> set[concurrent.futures.Future[None]]:
    return {guess for budget in budgets for guess in budget.guesses if guess is not but}


async def first_done(futures: Iterable[concurrent.futures.Future[None]]) -> None:
    """Wait until one of ``futures`` is done; cancelling the wait cancels none of them."""
    waits = [asyncio.shield(asyncio.wrap_future(future)) for future in futures]
    try:
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for wait in waits:
            wait.cancel()
