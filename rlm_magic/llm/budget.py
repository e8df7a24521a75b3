"""Cost budgets that are never exceeded: a call is sent only if the most it can cost
fits in what its budgets have left.

A budget (a run tree's ``max_cost_usd``, an RLM's ``RLM.max_session_cost_usd``) belongs
to the ledger whose records it limits (``UsageLedger.budget``); a call is held to every
budget on its ledger's parent chain. What a budget has left is its limit, less what its
ledger recorded, less what the calls in flight hold: each holds the most it can cost
(``Reservation``) until its record lands, which gives the rest back. The client admits a
call between preparing and sending it (``admit``); a map takes its items' holds in order
before it sends any (``admit_batch``), so a batch with room for ten sends ten.

The most a call can cost is its input, counted, at its model's highest input rate, plus
``max_tokens`` at its highest output rate, for each of its ``n`` answers. Its input is its
messages and whatever else the request carries that is billed as input (tools, functions,
a response_format: ``RLM.litellm_kwargs`` included), as JSON. A model litellm has no
price for is held at rates bounded by the costs its calls reported (a LiteLLM Proxy's
header), one call at a time until one has. A prompt up to ``SMALL_PROMPT`` characters
counts as its UTF-8 bytes (no byte-level tokenizer makes more tokens than bytes); a
larger one by litellm's tokenizer (the larger of that and the estimate), 5% over. On the
wire, where litellm is not imported (its import held the first request seconds), a
larger one counts as its bytes too, unless that does not fit: then litellm is imported
to count it, rather than refuse a call that fits. What can still pass the count: a
server that ignores ``max_tokens``, or a tokenizer that reads the prompt as more tokens
than litellm's. The first is watched as the answer streams (``Reservation.more``): past
its hold, the answer holds more, or is cut. The second is recorded as it was billed,
and leaves that much less for the next call. A model priced only by reports is not held
for its first call, nor for a fee per call.

One hold covers every attempt of a call: an attempt that brought text is kept as the
answer (cut, marked), never started over, and one that brought none was not billed
(a 429 neither); so the attempts together cost at most what the last one does.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import json
import re
import warnings
from collections.abc import Callable, Sequence
from typing import Any

from ..errors import AnswerOverBudget, BudgetExceededError
from .litellm_loader import load_litellm
from .messages import Messages
from .usage import CallRecord, UsageLedger
from .windows import dense_tokens, estimate_tokens

SMALL_PROMPT = 2_000  # characters: counted as bytes up to this, by a tokenizer past it
COUNT_MARGIN = 1.05  # over litellm's count: another tokenizer may read a few % more
_OFF_LOOP = 50_000  # characters: a prompt this long is counted in a thread (~15 ms / 400k)
_MESSAGE_OVERHEAD = 8  # tokens a chat template may add per message
# Output rate at most this many times the input rate, when learning a model's rates from
# reported costs: of litellm's 3,323 priced chat models, all but 3 (data errors, at 120x)
# charge at most 20x.
OUTPUT_RATIO = 20
# Request parameters that are not content: counted otherwise (the answer's size), or
# never sent in the body.
_NOT_CONTENT = frozenset({"max_tokens", "max_completion_tokens", "n", "best_of", "extra_headers"})


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
            f"{self.setting} is set, but litellm has no price for {model}: its calls "
            "are held at the rates the provider's reported costs imply (one at a time "
            "until one is reported), or if it reports none, sent while the budget has "
            "anything left, and counted as $0",
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
        # No price in litellm's map: what its record reports teaches the model's rates
        # (``landed``); ``first``: set while this is the one call of a model not yet
        # priced that may be in flight, resolved when it ends.
        self.learns = False
        self.first: concurrent.futures.Future[None] | None = None

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

    def landed(self, record: CallRecord) -> None:
        """The call's record (before ``release``): a reported cost of a model litellm
        cannot price teaches its rates, for the holds of its next calls."""
        if self.learns:
            _learn(self.model, record)

    def release(self) -> None:
        """The call's record has landed (or it never went): give the hold back."""
        if not self.released:
            self.released = True
            for budget in self.budgets:
                budget.held -= self.amount
        if self.first is not None and not self.first.done():
            self.first.set_result(None)  # the next call of its model may go

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


async def admit(
    ledger: UsageLedger,
    litellm: Any,
    model: str,
    rates: tuple[float, float] | None,
    messages: Messages,
    params: dict[str, Any],
    held: Reservation | None = None,
) -> Reservation | None:
    """Hold the most this call can cost in each of its ledger's budgets (``held``: a
    hold its map took for it, grown if the call came out larger); None when no budget
    limits it. ``rates``: dollars per input and output token it may be charged at most
    (``Endpoint.highest_rates``; None: unpriced). ``params``: the request's parameters
    besides its messages (``max_tokens``, ``RLM.litellm_kwargs``, a typed answer's
    ``response_format``), read only under a budget: no work for calls without one. A
    model litellm has no price for is held at the rates its reported costs imply
    (``_learn``); until one is reported, one call of it goes at a time (said once per
    budget, here, before it is sent).
    Raises ``BudgetExceededError`` when it does not fit: nothing is sent."""
    budgets = budgets_of(ledger)
    if not budgets:
        return None
    learns = rates is None
    if rates is None:
        for budget in budgets:
            budget.warn_unpriced(model)
        rates = await _reported_rates(model)
        if rates is None:  # no cost reported yet: this call goes alone, and teaches it
            _refuse_if_spent(budgets, model)
            return _first_of(model, budgets, held, _output_tokens(params))
    extra, output_tokens = _content(params), _output_tokens(params)
    reservation = held if held is not None else Reservation(budgets, model)
    tokens, litellm = await _input_held(
        litellm, model, messages, extra, _fits(budgets, rates, output_tokens, reservation.amount)
    )
    most = tokens * rates[0] + output_tokens * rates[1]
    reservation.output_tokens, reservation.output_rate = output_tokens, rates[1]
    reservation.learns = learns
    counter = _counter(litellm, model)
    warming = _WARM.get(model)
    if counter is not None and warming is None:
        # A long answer is counted as it streams, on the loop: the tokenizer loads in a
        # thread, once per model, before the first call under a budget is sent. Counted
        # meanwhile by an estimate, an answer dense in tokens (digits, CJK: a token a
        # character) ran 4x past its budget; counted at a token a character, an
        # ordinary one within max_tokens was cut. (Without litellm: ``dense_tokens``.)
        warming = _WARM[model] = asyncio.get_running_loop().run_in_executor(None, counter, "warm")
    if warming is not None and not warming.done():
        with contextlib.suppress(Exception):  # (no tokenizer: the estimate, as before)
            await asyncio.shield(warming)
    reservation.counter = counter if warming is not None else None
    reservation.grow(most - reservation.amount, _why(tokens, output_tokens, params, learns))
    return reservation


async def admit_batch(
    ledger: UsageLedger,
    litellm: Any,
    model: str,
    rates: tuple[float, float] | None,
    conversations: Sequence[Messages],
    max_tokens: int,
    options: dict[str, Any] | None = None,
) -> tuple[list[Reservation | None], BudgetExceededError | None]:
    """Holds for a batch's items, taken in order until one does not fit: the first
    ``len(holds)`` items may go; the error says why the rest are not sent (None when
    all fit). ``rates``: as ``admit``'s. ``options``: ``RLM.litellm_kwargs``, sent with
    each. Nothing is sent here (a model priced by reported costs only: each item's call
    waits in ``admit``)."""
    budgets = budgets_of(ledger)
    rates = rates if budgets else None
    learns = bool(budgets) and rates is None
    if learns:
        rates = _known_rates(model)
    if rates is None:
        try:
            _refuse_if_spent(budgets, model, not_sent=(len(conversations), len(conversations)))
        except BudgetExceededError as refused:
            return [], refused
        return [None] * len(conversations), None
    params = {**(options or {}), "max_tokens": max_tokens}
    extra, output_tokens = _content(params), _output_tokens(params)
    holds: list[Reservation | None] = []
    if litellm is None:  # the items at their bytes; counted by litellm if those do not fit
        bounds = [await input_tokens_at_most(None, model, m, extra) for m in conversations]
        fits = _fits(budgets, rates, output_tokens * len(conversations))
        if not fits(sum(bounds)) and any(
            _characters(m, extra) > SMALL_PROMPT for m in conversations
        ):
            litellm = await load_litellm()
    try:
        for index, messages in enumerate(conversations):
            tokens = await input_tokens_at_most(litellm, model, messages, extra)
            hold = Reservation(budgets, model, output_tokens, rates[1])
            hold.learns = learns
            try:
                hold.grow(
                    tokens * rates[0] + output_tokens * rates[1],
                    _why(tokens, output_tokens, params, learns),
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


def _content(params: dict[str, Any]) -> str:
    """What a request sends besides its messages that is billed as input (tools,
    tool_choice, functions, response_format...): as JSON, counted like a message.
    Numbers and flags (temperature, seed) are not content."""
    content = {
        name: value
        for name, value in params.items()
        if name not in _NOT_CONTENT and value is not None and not isinstance(value, (int, float))
    }
    return json.dumps(content, default=str, ensure_ascii=False) if content else ""


def _output_tokens(params: dict[str, Any]) -> int:
    """The most answer tokens a request may be billed: ``max_tokens`` (or a larger
    ``max_completion_tokens``) for each of its ``n`` (or ``best_of``) answers."""
    most = max(_whole(params.get("max_tokens")), _whole(params.get("max_completion_tokens")))
    return most * _answers(params)


def _answers(params: dict[str, Any]) -> int:
    """How many answers a request may be billed for: its ``n`` (or ``best_of``)."""
    return max(1, _whole(params.get("n")), _whole(params.get("best_of")))


def _whole(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


# -- models priced only by what their calls report -------------------------------------
# A model litellm has no price for may still have its calls' costs reported (a LiteLLM
# Proxy's x-litellm-response-cost). Held at $0, a batch of them raced past the budget
# (20 calls at $0.01 under $0.02: all sent), and one went while $0.005 was left to spend
# $0.01. So: until a cost is reported, one call of the model goes at a time; from then
# on its calls are held at rates its reports bound, as a priced model's are.


class _Reported:
    __slots__ = ("rates", "first", "unreported")

    def __init__(self) -> None:
        # Dollars per input and output token at most, from the reported costs.
        self.rates: tuple[float, float] | None = None
        # The call in flight while none has reported (thread-safe: any loop may wait).
        self.first: concurrent.futures.Future[None] | None = None
        # A call ended without a reported cost: its calls are not priced at all, and
        # go as before (one at a time would protect nothing).
        self.unreported = False


_REPORTED: dict[str, _Reported] = {}  # by model


def _known_rates(model: str) -> tuple[float, float] | None:
    state = _REPORTED.get(model)
    return state.rates if state is not None else None


async def _reported_rates(model: str) -> tuple[float, float] | None:
    """The rates ``model``'s reported costs bound, waiting for the call in flight to
    report one first; None when this call may go unheld (the one in flight, or its
    costs are not reported)."""
    while True:
        state = _REPORTED.setdefault(model, _Reported())
        if state.rates is not None or state.unreported:
            return state.rates
        first = state.first
        if first is None or first.done():
            return None
        await asyncio.shield(asyncio.wrap_future(first))


def _first_of(
    model: str, budgets: Sequence[CostBudget], held: Reservation | None, output_tokens: int
) -> Reservation:
    """An unheld reservation for a call of a model not yet priced; while no cost is
    reported it is the one in flight (the others wait in ``_reported_rates``)."""
    reservation = held if held is not None else Reservation(budgets, model)
    # (its stream is watched only past max_tokens: there is no rate to hold more at)
    reservation.output_tokens, reservation.learns = output_tokens, True
    state = _REPORTED.setdefault(model, _Reported())
    if state.rates is None and not state.unreported:
        reservation.first = state.first = concurrent.futures.Future()
    return reservation


def _learn(model: str, record: CallRecord) -> None:
    """Bound ``model``'s rates by a reported cost ``c`` of ``i`` uncached input and ``o``
    output tokens: ``c >= in_rate * i + out_rate * o``, so ``in_rate <= c / i`` and
    ``out_rate <= c / o``, and at most ``OUTPUT_RATIO * in_rate`` (a short answer
    bounds it loosely). The highest bounds seen are kept: a larger prompt may be
    priced higher (tiers). Sound for prices by the token; a fee per call is not."""
    state = _REPORTED.setdefault(model, _Reported())
    cost = record.cost_usd
    if not cost or cost <= 0:
        if record.error is None and state.rates is None:
            state.unreported = True
        return
    uncached = max(record.input_tokens - record.cached_input_tokens, 1)
    in_rate = cost / uncached
    out_rate = OUTPUT_RATIO * in_rate
    if record.output_tokens > 0:
        out_rate = min(out_rate, cost / record.output_tokens)
    if state.rates is not None:
        in_rate, out_rate = max(in_rate, state.rates[0]), max(out_rate, state.rates[1])
    state.rates, state.unreported = (in_rate, out_rate), False


def _refuse_if_spent(
    budgets: Sequence[CostBudget], model: str, not_sent: tuple[int, int] | None = None
) -> None:
    """A call without a price holds nothing, but goes only while its budgets have
    something left: what it costs may still be recorded (a proxy reports it)."""
    for budget in budgets:
        left = budget.left()
        if left <= 0:
            raise BudgetExceededError(
                model, 0.0, left, budget.named(), why=" (its price is not known)",
                not_sent=not_sent,
            )  # fmt: skip


def _why(tokens: int, output_tokens: int, params: dict[str, Any], reported: bool = False) -> str:
    answers = _answers(params)
    output = f"max_tokens={output_tokens // answers:,}"
    if answers > 1:  # each of n answers may take max_tokens
        output = f"{answers} answers of {output}"
    at = ", at the rates its reported costs imply" if reported else ""
    return f" (~{tokens:,} input tokens and {output}{at})"


def _fits(
    budgets: Sequence[CostBudget],
    rates: tuple[float, float],
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
    litellm: Any, model: str, messages: Messages, extra: str, fits: Callable[[int], bool]
) -> tuple[int, Any]:
    """Input tokens to hold for a call, and litellm as it now is: imported to count a
    large prompt only when its bytes (what it is held at without litellm) do not
    ``fit``: a budget near its end, where a call refused costs more than the import."""
    tokens = await input_tokens_at_most(litellm, model, messages, extra)
    if litellm is None and not fits(tokens) and _characters(messages, extra) > SMALL_PROMPT:
        litellm = await load_litellm()
        tokens = await input_tokens_at_most(litellm, model, messages, extra)
    return tokens, litellm


async def input_tokens_at_most(
    litellm: Any, model: str, messages: Messages, extra: str = ""
) -> int:
    """The most input tokens a provider may bill for ``messages`` and ``extra`` (see the
    module's docstring); a large prompt is counted off the loop. ``litellm`` None (not
    imported): its bytes."""
    if extra:
        messages = [*messages, {"role": "system", "content": extra}]
    texts = _texts(messages)
    overhead = _MESSAGE_OVERHEAD * len(messages)
    characters = sum(map(len, texts))
    if characters <= SMALL_PROMPT or litellm is None:
        return sum(len(text.encode("utf-8")) for text in texts) + overhead
    key = (model, hash(tuple(texts)), characters)
    counted = _COUNTED.get(key)
    if counted is None:
        try:
            # Off the loop when long, and the first time (the tokenizer loads: ~0.4 s).
            if characters > _OFF_LOOP or not _COUNTED:
                counted = await asyncio.to_thread(_count, litellm, model, messages)
            else:
                counted = _count(litellm, model, messages)
        except Exception:  # noqa: BLE001 - no tokenizer: the bytes bound
            counted = sum(len(text.encode("utf-8")) for text in texts)
        if len(_COUNTED) > 1024:
            _COUNTED.clear()
        _COUNTED[key] = counted
    return int(max(counted, estimate_tokens(messages, model)) * COUNT_MARGIN) + overhead


def _texts(messages: Messages) -> list[str]:
    return [
        m["content"] if isinstance(m.get("content"), str) else str(m.get("content"))
        for m in messages
    ]


def _characters(messages: Messages, extra: str) -> int:
    return sum(map(len, _texts(messages))) + len(extra)


# Counts of large prompts, by (model, the texts' hash, their length): a map's holds and
# then its calls count each prompt once.
_COUNTED: dict[tuple[str, int, int], int] = {}


_WARM: dict[str, asyncio.Future[int]] = {}  # by model: its tokenizer's loading


def _counter(litellm: Any, model: str) -> Callable[[str], int] | None:
    token_counter = getattr(litellm, "token_counter", None)
    if token_counter is None:
        return None
    return lambda text: token_counter(model=model, text=text)


def _count(litellm: Any, model: str, messages: Messages) -> int:
    counted = int(litellm.token_counter(model=model, messages=messages))
    if _THREE_DIGITS_A_TOKEN.match(model):
        return counted
    # litellm counts by OpenAI's tokenizer when it has no other, which reads up to three
    # digits a token; Gemini's, Qwen's, Llama 2's and Mistral's read one: a table of
    # numbers was billed 1.7x the hold. Each digit may be a token of its own.
    digits = sum(
        len(text) - len(text.translate(_NO_DIGITS))
        for text in (m.get("content") for m in messages)
        if isinstance(text, str)
    )
    return counted + (2 * digits + 2) // 3


_NO_DIGITS = str.maketrans("", "", "0123456789")
# Models whose tokenizer reads numbers three digits a token, as litellm counts them:
# OpenAI's (litellm's count is theirs) and Llama 3's.
_THREE_DIGITS_A_TOKEN = re.compile(r"^(?:.*/)?(?:gpt-|o\d|chatgpt-|(?:meta-)?llama-?3)", re.I)
