"""Cost budgets that are never exceeded: a call is sent only if the most it can cost
fits in what its budgets have left.

A budget (a run tree's ``max_cost_usd``, an RLM's ``RLM.max_session_cost_usd``) belongs
to the ledger whose records it limits (``UsageLedger.budget``); a call is held to every
budget on its ledger's parent chain. What a budget has left is its limit, less what its
ledger recorded, less what the calls in flight hold: each holds the most it can cost
(``Reservation``) until its record lands, which gives the rest back. The client admits a
call between preparing and sending it (``admit``); a map takes its items' holds in order
before it sends any (``admit_batch``), so a batch with room for ten sends ten.

The most a call can cost is its input (``billed_input``: its messages, and what else
it carries that is billed as input, as JSON) at its model's highest input rate, plus its
answer limit (``max_tokens``, or the caller's ``max_completion_tokens``: see
``answer_limit``) at its highest output rate, for each of its ``n`` answers. On the
wire, where litellm is not imported (its import held the first request seconds), a
large prompt counts as its bytes, unless that does not fit: then litellm is imported to
count it, rather than refuse a call that fits. What can still pass the count: a server
that ignores ``max_tokens``, or a tokenizer that reads the prompt as more tokens than
litellm's. The first is watched as the answer streams (``Reservation.more``): past its
hold, the answer holds more, or is cut. The second is recorded as it was billed, and
leaves that much less for the next call.

A model litellm has no price for, whose calls' costs are reported (a LiteLLM Proxy's
header), is held at the rates its reported costs bound (``reported_prices``, learned
per endpoint). Until one has reported, its calls are held at a guess: their input and
answer at the highest rates litellm prices any model at (``pricing.ceiling_rates``:
$150 / $600 a million tokens), which no model it knows charges more than. The first
goes at once, holding its guess or, if that is more, all its budgets have left; the
next wait for its cost unless their guess fits beside it. A call of any model that
does not fit while a guess is held waits for that call to land (giving most of it
back) rather than be refused. So a burst of first calls goes one call's time later
than a priced model's would, and the budget holds. What is left open, against refusing
all that does not fit at the guess (a call of 4,096 answer tokens is guessed at $2.46:
no run under a $1 budget could start): a first call dearer than all its budgets had
left. A model whose calls report no cost is sent while its budgets have anything left,
counted as $0 (said once per budget); a fee per call is not held.

One hold covers every attempt of a call: an attempt that brought text is kept as the
answer (cut, marked), never started over, and one that brought none was not billed
(a 429 neither); so the attempts together cost at most what the last one does.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import json
from collections.abc import Callable, Mapping, Sequence
from types import ModuleType

from ..errors import BudgetExceededError
from .answer_limit import NAMES as ANSWER_LIMIT_NAMES
from .answer_limit import answer_limit_at_most, one_answer_limit
from .billed_input import SMALL_PROMPT, answer_counter, characters, input_tokens_at_most
from .holds import CostBudget, Reservation, budgets_of, first_done, guesses_but, hold_or_wait
from .litellm_loader import load_litellm
from .messages import Messages
from .pricing import ceiling_rates
from .profiles import PROFILES, ReportedPrice
from .reported_prices import LearnedPrices
from .usage import UsageLedger

__all__ = [
    "CostBudget",
    "LearnedPrices",
    "Reservation",
    "admit",
    "admit_batch",
    "budgets_of",
    "input_tokens_at_most",
]

# Request parameters that are not content: counted otherwise (the answer's size), or
# never sent in the body.
_NOT_CONTENT = frozenset({*ANSWER_LIMIT_NAMES, "n", "best_of", "extra_headers"})
# A request's parameters besides its messages, as sent (JSON values).
Params = Mapping[str, object]
Rates = tuple[float, float]  # dollars per input token, per output token


async def admit(
    ledger: UsageLedger,
    litellm: ModuleType | None,
    model: str,
    rates: Rates | None,
    messages: Messages,
    params: Params,
    held: Reservation | None = None,
    *,
    endpoint: str | None = None,
    learned: LearnedPrices = PROFILES,
) -> Reservation | None:
    """Hold the most this call can cost in each of its ledger's budgets (``held``: a
    hold its map took for it, grown if the call came out larger); None when no budget
    limits it. ``rates``: dollars per input and output token it may be charged at most
    (``Endpoint.highest_rates``; None: unpriced). ``params``: the request's parameters
    besides its messages (its answer limit, ``RLM.litellm_kwargs``, a typed answer's
    ``response_format``), read only under a budget: no work for calls without one. A
    model litellm has no price for is held as the module's docstring says, by what
    ``learned`` keeps of its price at ``endpoint`` (``RLM.api_base``, or a Router's
    name); said once per budget, here, before its first call is sent.
    Raises ``BudgetExceededError`` when it does not fit: nothing is sent; a call that
    does not fit while another is held at a guess waits for that one first."""
    budgets = budgets_of(ledger)
    if not budgets:
        return None
    reservation = held if held is not None else Reservation(budgets, model)
    extra, output_tokens = _content(params), answer_limit_at_most(params) * _answers(params)
    price = None
    try:
        if rates is None:
            for budget in budgets:
                budget.warn_unpriced(model)
            price = reservation.learns = learned.reported_price(endpoint, model)
            rates = await _rates_reported(price, reservation, litellm, messages, extra, params)
            if rates is None:  # held at a guess, or its costs are never reported
                reservation.counter = await _answer_counter(litellm, model, learned)
                return reservation
        tokens, litellm = await _input_held(
            litellm,
            model,
            messages,
            extra,
            _fits(budgets, rates, output_tokens, reservation.amount),
        )
        reservation.output_tokens, reservation.output_rate = output_tokens, rates[1]
        reservation.counter = await _answer_counter(litellm, model, learned)
        most = tokens * rates[0] + output_tokens * rates[1]
        await hold_or_wait(
            reservation, most, _why(tokens, output_tokens, params, price is not None)
        )
    except BaseException:
        if held is None:  # (a map's hold is the client's to give back)
            reservation.release()  # the calls waiting for its guess may go
        raise
    return reservation


async def admit_batch(
    ledger: UsageLedger,
    litellm: ModuleType | None,
    model: str,
    rates: Rates | None,
    conversations: Sequence[Messages],
    max_tokens: int,
    options: Params | None = None,
    *,
    endpoint: str | None = None,
    learned: LearnedPrices = PROFILES,
) -> tuple[list[Reservation | None], BudgetExceededError | None]:
    """Holds for a batch's items, taken in order until one does not fit: the first
    ``len(holds)`` items may go; the error says why the rest are not sent (None when
    all fit). ``rates``, ``endpoint``, ``learned``: as ``admit``'s. ``options``:
    ``RLM.litellm_kwargs``, sent with each. Nothing is sent here (a model not yet
    priced by its reported costs: each item's call is held in ``admit``)."""
    budgets = budgets_of(ledger)
    price = None
    if budgets and rates is None:
        price = learned.reported_price(endpoint, model)
        rates = price.rates
    if rates is None:
        try:
            _refuse_if_spent(budgets, model, not_sent=(len(conversations), len(conversations)))
        except BudgetExceededError as refused:
            return [], refused
        return [None] * len(conversations), None
    # (the answer limit each item's request will carry: the smaller, under one name)
    params = one_answer_limit({**(options or {}), "max_tokens": max_tokens})
    extra, output_tokens = _content(params), answer_limit_at_most(params) * _answers(params)
    holds: list[Reservation | None] = []
    if litellm is None:  # the items at their bytes; counted by litellm if those do not fit
        bounds = [await input_tokens_at_most(None, model, m, extra) for m in conversations]
        fits = _fits(budgets, rates, output_tokens * len(conversations))
        if not fits(sum(bounds)) and any(
            characters(m, extra) > SMALL_PROMPT for m in conversations
        ):
            litellm = await load_litellm()
    try:
        for index, messages in enumerate(conversations):
            tokens = await input_tokens_at_most(litellm, model, messages, extra)
            hold = Reservation(budgets, model, output_tokens, rates[1])
            hold.learns = price
            try:
                await hold_or_wait(
                    hold,
                    tokens * rates[0] + output_tokens * rates[1],
                    _why(tokens, output_tokens, params, price is not None),
                    not_sent=(len(conversations) - index, len(conversations)),
                )
            except BudgetExceededError as refused:
                return holds, refused
            holds.append(hold)
    except BaseException:  # interrupted while counting: nothing is sent, nothing held
        for taken in holds:
            if taken is not None:
                taken.release()
        raise
    return holds, None


def _content(params: Params) -> str:
    """What a request sends besides its messages that is billed as input (tools,
    tool_choice, functions, response_format...): as JSON, counted like a message.
    Numbers and flags (temperature, seed) are not content."""
    content = {
        name: value
        for name, value in params.items()
        if name not in _NOT_CONTENT and value is not None and not isinstance(value, (int, float))
    }
    return json.dumps(content, default=str, ensure_ascii=False) if content else ""


def _answers(params: Params) -> int:
    """How many answers a request may be billed for: its ``n`` (or ``best_of``)."""
    return max(1, _whole(params.get("n")), _whole(params.get("best_of")))


def _whole(value: object) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


# -- models priced only by what their calls report -------------------------------------
# A model litellm has no price for may still have its calls' costs reported (a LiteLLM
# Proxy's x-litellm-response-cost). Held at $0, a batch of them raced past the budget
# (20 calls at $0.01 under $0.02: all sent), and one went while $0.005 was left to spend
# $0.01; unheld while the first was in flight, a priced call beside it could take what
# it would spend. So: until a cost is reported, each is held at a guess (the module's
# docstring); from then on at rates its reports bound, as a priced model's are.


async def _rates_reported(
    price: ReportedPrice,
    reservation: Reservation,
    litellm: ModuleType | None,
    messages: Messages,
    extra: str,
    params: Params,
) -> Rates | None:
    """The rates ``price`` has learned, waiting for the call in flight to report them
    when this one does not fit beside it; None when this call is held here already (at
    a guess: ``reservation.guess``), or goes unheld (its costs are never reported)."""
    if price.rates is not None:
        return price.rates
    budgets, model = reservation.budgets, reservation.model
    output_tokens = answer_limit_at_most(params) * _answers(params)
    ceiling = ceiling_rates(litellm)
    tokens = await input_tokens_at_most(litellm, model, messages, extra)
    guess = tokens * ceiling[0] + output_tokens * ceiling[1]
    why = _why(tokens, output_tokens, params, guessed=True)
    while True:
        if price.rates is not None:
            return price.rates
        reservation.output_tokens, reservation.output_rate = output_tokens, ceiling[1]
        if price.unreported:  # nothing to learn: nothing to hold it at
            _refuse_if_spent(budgets, model)
            reservation.output_rate = 0.0  # (watched only past its answer limit)
            return None
        first = price.first
        if first is None or first.done():  # the one call that goes whatever its guess
            price.first = reservation.claim_guess()
            left = await _some_left(reservation)
            reservation.hold_guess(min(guess - reservation.amount, left), why)
            return None
        if _fits(budgets, ceiling, output_tokens, reservation.amount)(tokens):
            reservation.hold_guess(guess - reservation.amount, why)  # beside the first
            return None
        await first_done([first])


async def _some_left(reservation: Reservation) -> float:
    """What all of ``reservation``'s budgets have left, once it is more than nothing
    (or the call holds something already): waiting for calls held at a guess to land
    while none is left. Raises ``BudgetExceededError`` when none is left and no such
    call is in flight."""
    budgets = reservation.budgets
    while True:
        left = min(budget.left() for budget in budgets)
        if left > 0 or reservation.amount > 0:
            return max(left, 0.0)
        guesses = guesses_but(budgets, but=reservation.guess)
        if not guesses:
            spent = min(budgets, key=lambda budget: budget.left())
            raise BudgetExceededError(
                reservation.model, 0.0, left, spent.named(), why=" (its price is not known)"
            )
        await first_done(guesses)


def _refuse_if_spent(
    budgets: Sequence[CostBudget], model: str, not_sent: tuple[int, int] | None = None
) -> None:
    """A call without a price goes only while its budgets have something left: what
    it costs may still be recorded (a proxy reports it)."""
    for budget in budgets:
        left = budget.left()
        if left <= 0:
            raise BudgetExceededError(
                model, 0.0, left, budget.named(), why=" (its price is not known)",
                not_sent=not_sent,
            )  # fmt: skip


def _why(
    tokens: int, output_tokens: int, params: Params, reported: bool = False, guessed: bool = False
) -> str:
    answers = _answers(params)
    name = "max_completion_tokens" if "max_completion_tokens" in params else "max_tokens"
    output = f"{name}={output_tokens // answers:,}"
    if answers > 1:  # each of n answers may take max_tokens
        output = f"{answers} answers of {output}"
    at = ", at the rates its reported costs imply" if reported else ""
    if guessed:
        at = ", at the highest rates litellm prices any model at: its price is not known yet"
    return f" (~{tokens:,} input tokens and {output}{at})"


def _fits(
    budgets: Sequence[CostBudget],
    rates: Rates,
    output_tokens: int,
    held: float = 0.0,
) -> Callable[[int], bool]:
    """Whether a hold of so many input tokens (beside ``output_tokens``, and ``held``
    already) fits in what every one of ``budgets`` has left now."""

    def fits(tokens: int) -> bool:
        extra = tokens * rates[0] + output_tokens * rates[1] - held
        return all(extra <= budget.left() for budget in budgets)

    return fits


async def _input_held(
    litellm: ModuleType | None,
    model: str,
    messages: Messages,
    extra: str,
    fits: Callable[[int], bool],
) -> tuple[int, ModuleType | None]:
    """Input tokens to hold for a call, and litellm as it now is: imported to count a
    large prompt only when its bytes (what it is held at without litellm) do not
    ``fit``: a budget near its end, where a call refused costs more than the import."""
    tokens = await input_tokens_at_most(litellm, model, messages, extra)
    if litellm is None and not fits(tokens) and characters(messages, extra) > SMALL_PROMPT:
        litellm = await load_litellm()
        tokens = await input_tokens_at_most(litellm, model, messages, extra)
    return tokens, litellm


async def _answer_counter(
    litellm: ModuleType | None, model: str, learned: LearnedPrices
) -> Callable[[str], int] | None:
    """What counts a long answer as it streams, on the loop: litellm's tokenizer, loaded
    in a thread once per model (``ModelProfile.tokenizer_loading``) before the first call
    under a budget is sent. Counted meanwhile by an estimate, an answer dense in tokens
    (digits, CJK: a token a character) ran 4x past its budget; counted at a token a
    character, an ordinary one within max_tokens was cut. None (no litellm): the
    estimate, ``dense_tokens``."""
    counter = answer_counter(litellm, model)
    if counter is None:
        return None
    profile = learned.model(model)
    loading = profile.tokenizer_loading
    if loading is None:
        loading = profile.tokenizer_loading = concurrent.futures.Future()
        asyncio.get_running_loop().run_in_executor(None, _load_tokenizer, counter, loading)
    if not loading.done():
        await asyncio.shield(asyncio.wrap_future(loading))
    return counter


def _load_tokenizer(counter: Callable[[str], int], loaded: concurrent.futures.Future[None]) -> None:
    with contextlib.suppress(Exception):  # (no tokenizer: the estimate, as before)
        counter("warm")
    loaded.set_result(None)
