"""The methods compared, each asked the same items through the same ``RLM``: its client
(one concurrency limit, the cache, the rate gates), its settings and its budgets.

- ``rlm``: an RLM run as configured (root model, sub-model, sandbox, depth);
- ``direct``: one call to the root model with the question and the context, as much of
  it as the model's window takes (the item's ``notes`` say when it was cut, and how far);
- ``map``: a plain chunked map, the context in chunks of ``chunk_tokens``, each asked
  the question through the map ``llm_query_batch`` runs (``maps.run_map``, sub-model),
  then one combining call (root model) given every part's answer.

Each method also estimates, before anything is sent, the calls and tokens an item of a
given size takes (``estimate``): the dry run's plan.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from ..errors import ConfigError, PromptTooLongError
from ..llm.messages import build_messages
from ..llm.usage import UsageLedger
from ..maps.run_map import MapSpec, run_map
from ..rlm.run import Run
from ..rlm.tree import RunTree
from .tasks import CHARS_PER_TOKEN, Item, estimate_tokens

if TYPE_CHECKING:
    from ..rlm.result import RLMResult
    from ..rlm.runner import RLM

# Tokens an answer of these tasks takes, for the plan (a number, a name, a few pairs).
ANSWER_TOKENS = 100
# The plan's reckoning of an RLM run: root turns, and tokens each (its system prompt and
# the conversation so far; the context itself reaches it only through its code).
RLM_TURNS = 4
RLM_TURN_INPUT = 3_000
RLM_TURN_OUTPUT = 400

_FITTING_ATTEMPTS = 3  # a direct call cut to the window is asked at most this often
DIRECT_PROMPT = "{question}\n\nThe data:\n{context}"
PART_PROMPT = (
    "{question}\n\nThis is part {number} of {parts} of the data. Answer from this part "
    "alone, in the form the question asks for; if it holds nothing that answers it, "
    "answer: not found.\n\nThe data:\n{chunk}"
)
# The demo model recognises this wording (rlm_magic.demo.script): keep them in step.
COMBINE_PROMPT = (
    "{question}\n\nThe data was split into {parts} parts and each was asked the question "
    "alone.\nAnswers from the parts:\n{answers}\n\nCombine them into the one answer to the "
    "question, in the form it asks for."
)


@dataclass
class Answer:
    """What a method answered for one item (``text`` None: it failed, ``error`` says)."""

    text: str | None
    error: str | None = None
    notes: list[str] = field(default_factory=list)
    # How it got there: an ``RLMResult`` (rlm), or the calls' prompts and answers.
    trajectory: Any = None


@dataclass(frozen=True)
class Estimate:
    """The calls and tokens one item is expected to take (a plan, not a promise)."""

    calls: int
    input_tokens: int
    output_tokens: int
    models: tuple[tuple[str, int, int], ...] = ()  # (model, input, output) tokens each


class Method(Protocol):
    name: str

    async def answer(self, item: Item, rlm: RLM, ledger: UsageLedger) -> Answer: ...

    def estimate(self, size: int, question_tokens: int, rlm: RLM) -> Estimate: ...


class RLMMethod:
    """An RLM run, as ``%%rlm`` would make it with the same settings."""

    name = "rlm"

    async def answer(self, item: Item, rlm: RLM, ledger: UsageLedger) -> Answer:
        tree = RunTree(
            UsageLedger(parent=ledger),
            rlm.max_sub_calls,
            rlm.max_cost_usd,
            max_child_sandboxes=rlm.sandbox_max_children,
        )
        run = Run(rlm, rlm.client, item.question, item.context, tree=tree)
        result: RLMResult = await run.execute()
        if not result.success or result.final_answer is None:
            return Answer(None, result.error or result.stop_reason or "no answer", [], result)
        return Answer(str(result.final_answer), trajectory=result)

    def estimate(self, size: int, question_tokens: int, rlm: RLM) -> Estimate:
        parts = _parts(size, MapMethod.chunk_tokens)
        root_in = RLM_TURNS * (RLM_TURN_INPUT + question_tokens)
        sub_in = size + parts * question_tokens
        root_out, sub_out = RLM_TURNS * RLM_TURN_OUTPUT, parts * ANSWER_TOKENS
        return Estimate(
            RLM_TURNS + parts,
            root_in + sub_in,
            root_out + sub_out,
            ((rlm.model, root_in, root_out), (rlm.effective_sub_model, sub_in, sub_out)),
        )


class DirectMethod:
    """One call with the whole context, or as much of its head as the window takes."""

    name = "direct"

    async def answer(self, item: Item, rlm: RLM, ledger: UsageLedger) -> Answer:
        client, model = rlm.client, rlm.model
        await client.look_up_windows(model)
        window = client.input_window(model, advice=True)
        context = item.context
        if window is not None:
            room = window - rlm.max_tokens - estimate_tokens(item.question) - 64
            context = _head(context, max(0, int(room * 0.95 * CHARS_PER_TOKEN)))
        for attempt in range(_FITTING_ATTEMPTS):
            prompt = DIRECT_PROMPT.format(question=item.question, context=context)
            try:
                completion = await client.complete(
                    build_messages(prompt, None), model=model, ledger=ledger, stream=True
                )
                break
            except PromptTooLongError as exc:
                # The model's tokenizer reads more tokens than the estimate (digits and
                # symbols are dense): cut in the ratio the refusal gives, and ask again.
                if attempt == _FITTING_ATTEMPTS - 1 or exc.tokens <= 0:
                    raise
                context = _head(context, int(len(context) * exc.room / exc.tokens * 0.97))
        notes = []
        if len(context) < len(item.context):
            notes.append(
                f"context cut to its first ~{estimate_tokens(context):,} of "
                f"~{estimate_tokens(item.context):,} tokens: {model}'s window is "
                f"{window:,} tokens"
                if window
                else f"context cut to its first ~{estimate_tokens(context):,} tokens"
            )
        return Answer(
            completion.text,
            notes=notes,
            trajectory={"calls": [_call(model, prompt, completion.text)]},
        )

    def estimate(self, size: int, question_tokens: int, rlm: RLM) -> Estimate:
        window = rlm.client.input_window(rlm.model, advice=True)
        sent = size if window is None else min(size, max(0, window - rlm.max_tokens))
        tokens = sent + question_tokens
        return Estimate(1, tokens, ANSWER_TOKENS, ((rlm.model, tokens, ANSWER_TOKENS),))


class MapMethod:
    """A plain chunked map: every chunk asked the question, then one combining call."""

    name = "map"
    chunk_tokens = 16_000

    def __init__(self, chunk_tokens: int | None = None):
        if chunk_tokens is not None:
            if chunk_tokens < 100:
                raise ConfigError(f"chunk_tokens must be >= 100, got {chunk_tokens}")
            self.chunk_tokens = chunk_tokens

    async def answer(self, item: Item, rlm: RLM, ledger: UsageLedger) -> Answer:
        client = rlm.client
        chunks = chunk_lines(item.context, self.chunk_tokens * CHARS_PER_TOKEN)
        prompts = [
            PART_PROMPT.format(question=item.question, number=n, parts=len(chunks), chunk=chunk)
            for n, chunk in enumerate(chunks, 1)
        ]
        answers, errors = await run_map(
            client, [build_messages(p, None) for p in prompts], MapSpec(ledger=ledger)
        )
        parts = [
            str(a) if a is not None else f"(no answer: {_first_line(errors.get(n))})"
            for n, a in enumerate(answers)
        ]
        combine = COMBINE_PROMPT.format(
            question=item.question,
            parts=len(parts),
            answers="\n".join(f"Part {n}: {' '.join(a.split())}" for n, a in enumerate(parts, 1)),
        )
        completion = await client.complete(
            build_messages(combine, None), model=rlm.model, ledger=ledger, stream=True
        )
        sub = rlm.effective_sub_model
        calls = [_call(sub, p, a) for p, a in zip(prompts, parts)]
        calls.append(_call(rlm.model, combine, completion.text))
        notes = [f"{len(errors)} of {len(chunks)} parts failed"] if errors else []
        return Answer(completion.text, notes=notes, trajectory={"calls": calls})

    def estimate(self, size: int, question_tokens: int, rlm: RLM) -> Estimate:
        parts = _parts(size, self.chunk_tokens)
        sub_in = size + parts * (question_tokens + 60)
        sub_out = parts * ANSWER_TOKENS
        root_in = question_tokens + 60 + parts * (ANSWER_TOKENS + 4)
        return Estimate(
            parts + 1,
            sub_in + root_in,
            sub_out + ANSWER_TOKENS,
            ((rlm.effective_sub_model, sub_in, sub_out), (rlm.model, root_in, ANSWER_TOKENS)),
        )


def chunk_lines(text: str, characters: int) -> list[str]:
    """``text`` in chunks of whole lines of about ``characters`` each (a longer line is a
    chunk of its own)."""
    chunks: list[str] = []
    part: list[str] = []
    size = 0
    for line in text.split("\n"):
        if part and size + len(line) > characters:
            chunks.append("\n".join(part))
            part, size = [], 0
        part.append(line)
        size += len(line) + 1
    if part or not chunks:
        chunks.append("\n".join(part))
    return chunks


def _head(text: str, characters: int) -> str:
    """The first ``characters`` of ``text``, at a line's end (all of it if it fits)."""
    if len(text) <= characters:
        return text
    return text[:characters].rsplit("\n", 1)[0]


def _parts(size: int, chunk_tokens: int) -> int:
    # An item runs a line past its size, and a chunk stops a line short of its own: a
    # context of exactly two chunks' size makes three.
    return max(1, math.ceil(size * 1.01 / chunk_tokens))


def _call(model: str, prompt: str, answer: str) -> dict[str, str]:
    """A call as the trajectory keeps it: the prompt's head and tail, the whole answer."""
    shown = prompt if len(prompt) <= 600 else f"{prompt[:400]}\n[...]\n{prompt[-200:]}"
    return {"model": model, "prompt": shown, "answer": answer}


def _first_line(error: BaseException | None) -> str:
    return (
        str(error).strip().splitlines()[0] if error is not None and str(error).strip() else "failed"
    )


BUILT_IN: dict[str, type[RLMMethod] | type[DirectMethod] | type[MapMethod]] = {
    "rlm": RLMMethod,
    "direct": DirectMethod,
    "map": MapMethod,
}


def resolve(methods: Any, chunk_tokens: int | None = None) -> list[Method]:
    """Methods by name (``"rlm,direct"``, a list of names, or method objects)."""
    if methods is None:
        methods = list(BUILT_IN)
    if isinstance(methods, str):
        methods = [name.strip() for name in methods.split(",") if name.strip()]
    found: list[Method] = []
    for method in methods:
        if not isinstance(method, str):
            found.append(method)
        elif method == "map":
            found.append(MapMethod(chunk_tokens))
        elif method in BUILT_IN:
            found.append(BUILT_IN[method]())
        else:
            raise ConfigError(f"unknown method {method!r}: choose from {', '.join(BUILT_IN)}")
    return found
