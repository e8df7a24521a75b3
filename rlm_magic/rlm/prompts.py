"""What the root model is told (its replies are read by ``replies``).

The system prompt follows the official RLM library's, with the advice that matters
here: batches run concurrently, so fan out with ``llm_query_batch``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..llm.profiles import DEFAULT_CHARS_PER_TOKEN
from ..llm.windows import answer_room, chars_per_token

if TYPE_CHECKING:
    from .scope import RunScope
    from .session import RLMSession

SYSTEM_PROMPT = """\
You are answering a question about a context that may be far too large to read at once.
You work in a Python REPL. Write code in ```repl blocks; each block runs in order and you
see its printed output (cut to {max_output_chars:,} characters), errors and the value of
its last line in the next message. End your reply after your code: never write what you
expect it to print.

The REPL has:
- `context`: the data ({context_type}, length {context_length:,}). Preview:
{context_preview}
- `llm_query(prompt)` -> str: ask a sub-model (it can read {sub_model_reads} per prompt).
- `llm_query_batch(prompts)` -> list[str]: ask many prompts CONCURRENTLY; answers come back
  in order. It is as fast as one call: always prefer it to a loop of llm_query calls.
  Both take `response_format=` a JSON schema (a dict) to get validated dicts back.
- `rlm_query(prompt, context=None)` -> str: a child RLM with its own REPL for a hard
  sub-problem (nesting depth left: {depth_left}); `rlm_query_batch(prompts, contexts)`.
- `SHOW_VARS()` -> str: the variables you have made so far.
- `FINAL(answer)`: finish with this answer (see below).
Helpers work with or without `await`. A failed sub-call returns a string starting with
"Error:" instead of raising, so check answers before you rely on them. Variables persist
between blocks. Use print() to see values.

How to work:
1. Look at the context first: its structure, size, a few samples.
2. Split it into chunks (about {chunk_size} characters, or a few hundred rows), ask one
   llm_query_batch over all chunks, then combine the answers in code or with a final
   llm_query.
3. Keep large values in variables; print only what you need to see.

When you have the answer, finish by calling FINAL in a ```repl block:
```repl
FINAL(summary)  # a variable, or a literal: FINAL("Paris")
```
The run ends when that block ends, and the answer is exactly the value you passed (a
string as it is; anything else converted with str()). Do not call FINAL before you have
looked at the data. An answer you type yourself in a reply whose code reads the data is not
taken (you had not seen that code's output yet): pass the value your code computed.
"""

ITERATION_LIMIT_PROMPT = (
    "You have reached the iteration limit. Do not write more code. Give your best final "
    "answer now, on its own line, as FINAL(answer)."
)

SUMMARY_PROMPT = (
    "Your conversation is about to be compacted to fit your context window. Write a "
    "summary of your progress so far, for yourself to continue from: what the question "
    "needs, what you have learned (with the figures and facts found), which REPL "
    "variables hold what (their names and contents), and what is left to do. Write no "
    "code and no FINAL; only the summary."
)

AFTER_COMPACTION_PROMPT = (
    "Your conversation was compacted to fit your context window (compaction {number}); "
    "your summary of it is above. Every REPL variable is kept, and the full conversation "
    "so far is in the REPL variable `history` (a list of {{'role', 'content'}} dicts). "
    "Continue from the summary."
)

CONTINUE_PROMPT = (
    "Continue. Write ```repl code to make progress, or call FINAL(answer) in a ```repl "
    "block once you have the answer."
)


def chunk_advice(
    room_tokens: int | None, chars_per_token: float = DEFAULT_CHARS_PER_TOKEN
) -> tuple[str, str]:
    """(what one sub-model prompt can hold, a chunk size to suggest), from the tokens
    the sub-model takes as a prompt; the classic advice when that is unknown."""
    if room_tokens is None:
        return "~100k characters", "20k-100k"
    reads = _round(room_tokens * chars_per_token * 0.8)  # room for the question too
    high = min(100_000, _round(reads * 0.75))
    low = min(20_000, _round(high / 4))
    return f"~{_short_number(reads)} characters", f"{_short_number(low)}-{_short_number(high)}"


# A step's output is shown to the root model up to a quarter of its window (as its
# tokenizer counts), never less than this; ``RLM.max_output_chars`` at most, and exactly
# that when the user set it.
MIN_OUTPUT_CHARS = 500
# Characters of the context a local server's tokenizer counts before the first turn.
SAMPLE_CHARS = 6_000
# Cuts a text to a number of characters (``Redactor.head`` cuts it redacted).
Cut = Callable[[str, int], str]


def output_chars(configured: int, explicit: bool, window: int | None, per_token: float) -> int:
    """Characters of one step's output the root model is shown: ``configured`` when
    the user set it (``explicit``) or the window is unknown, else no more than a quarter
    of the window at the model's characters per token, so that one step's output fits
    beside the conversation (20,000 characters of log text were 11k Gemma tokens, past
    a 4,096-token window: every next turn compacted first)."""
    if explicit or not window:
        return configured
    return min(configured, max(MIN_OUTPUT_CHARS, _round(window / 4 * per_token)))


def set_by_user(config: Any, name: str) -> bool:
    """Whether the user set ``RLM.<name>``: to other than its default, or through
    traitlets' config (``%config RLM.<name> = ...``, ``ipython_config.py``)."""
    trait = config.traits().get(name)
    if trait is None or getattr(config, name) != trait.default_value:
        return True
    return any(name in (config.config.get(cls.__name__) or {}) for cls in type(config).__mro__)


def context_sample(context: Any) -> str | None:
    """Up to ``SAMPLE_CHARS`` of the context's text (its start, middle and end), as
    sub-calls will read it: what a local server's tokenizer counts before the first
    turn (``LLMClient.look_up_windows``)."""
    if context is None:
        return None
    if isinstance(context, str):
        text = context
    elif isinstance(context, (list, tuple)) and context and isinstance(context[0], str):
        text = "\n".join(str(item) for item in context[:200])
    else:
        text = describe_context(context)[2]
    if len(text) <= SAMPLE_CHARS:
        return text or None
    third, middle = SAMPLE_CHARS // 3, len(text) // 2
    return text[:third] + text[middle : middle + third] + text[-third:]


def _round(value: float) -> int:
    """Two significant digits: advice, not a measurement."""
    value = int(value)
    if value < 100:
        return max(1, value)
    digits = len(str(value)) - 2
    return round(value, -digits)


def _short_number(value: int) -> str:
    if value >= 1_000_000:
        return f"{value / 1_000_000:g}M"
    return f"{value / 1000:g}k" if value >= 1000 else str(value)


def _cut(text: str, limit: int) -> str:
    return text[:limit]


def describe_context(context: Any, head: Cut = _cut) -> tuple[str, int, str]:
    """(type name, length, preview) of a context of any type, without copying it.
    ``head(text, limit)`` cuts each part of the preview (a redactor's ``head`` removes a
    secret the cut falls inside of whole, where redacting after the cut would leave its
    start)."""
    type_name = type(context).__name__
    if context is None:
        return "NoneType", 0, "(no context was given)"
    shape = getattr(context, "shape", None)
    try:
        length = len(context)
    except TypeError:
        length = 1
    if hasattr(context, "columns") and shape is not None:  # a DataFrame
        preview = f"shape {tuple(shape)}, columns {list(context.columns)[:30]}\n" + head(
            context.head(5).to_string(max_colwidth=80), 1500
        )
    elif isinstance(context, str):
        preview = head(context, 800) + (" ..." if len(context) > 800 else "")
    elif isinstance(context, dict):
        keys = list(context)[:30]
        preview = f"keys: {keys}" + (" ..." if len(context) > 30 else "")
    elif isinstance(context, (list, tuple)):
        items = [_short(item, head=head) for item in context[:5]]
        preview = f"first items: [{', '.join(items)}]" + (" ..." if len(context) > 5 else "")
    else:
        preview = _short(context, 800, head)
    return type_name, length, preview


def _short(value: Any, limit: int = 200, head: Cut = _cut) -> str:
    text = repr(value)
    return text if len(text) <= limit else head(text, limit) + "..."


class RunPrompts:
    """A run's system prompt and first message. The system prompt advises how much one
    sub-call can read: the sub-model's window less its answers' room, at the characters
    per token its usage showed; it is written again when what is known of either moves
    enough to change the advice (``refreshed``), and only then (a new system prompt costs
    the provider's prompt cache its prefix)."""

    def __init__(self, scope: RunScope, template: str | None = None):
        self.client = scope.client
        self.template = template or SYSTEM_PROMPT
        settings = scope.settings
        self.sub_model, self.max_tokens = settings.sub_model, settings.max_tokens
        self.max_depth, self.depth = settings.max_depth, scope.depth
        self.max_output_chars = self.configured_output_chars = settings.max_output_chars
        self._described: tuple[str, int, str] | None = None
        self._advised_for: tuple[int | None, float] = (None, DEFAULT_CHARS_PER_TOKEN)

    def system(self, context: Any) -> str:
        if self._described is None:
            self._described = describe_context(context, self.client.redactor().head)
        type_name, length, preview = self._described
        self._advised_for = self._sub_model_now()
        reads, chunk = self._chunk_advice()
        fields = _Fields(
            context_type=type_name,
            context_length=length,
            sub_model_reads=reads,
            chunk_size=chunk,
            context_preview=self.client.redactor()(preview),
            max_depth=self.max_depth,
            depth_left=self.max_depth - self.depth,
            max_output_chars=self.max_output_chars,
        )
        try:
            return self.template.format_map(fields)
        except (ValueError, IndexError):
            return self.template  # a custom prompt with literal braces: used as written

    def refreshed(self, context: Any) -> str | None:
        """A new system prompt when a window learned since the last one (or a tokenizer
        that reads a quarter more or less than it assumed) changes the advice; else None."""
        window, per_token = self._advised_for
        now = self._sub_model_now()
        if now[0] == window and abs(now[1] - per_token) <= 0.25 * per_token:
            return None
        return self.system(context)

    def first_message(self, query: str, session: RLMSession | None) -> str:
        question = (
            f"Question: {query}\n\nThe data is in the REPL variable `context`. "
            "Look at it before you answer."
        )
        if session is None or not session.exchanges:
            return question
        contexts = len(session.contexts)
        earlier = (
            f" Earlier contexts of this session: "
            f"{', '.join(f'context_{i}' for i in range(contexts - 1))}."
            if contexts > 1
            else ""
        )
        return f"{session.memory()}\n\n{question}{earlier}"

    def fit_output(self, model: str, explicit: bool) -> int:
        """``max_output_chars`` for a run whose root model is ``model`` (see
        ``output_chars``), told in the system prompt from now on."""
        self.max_output_chars = output_chars(
            self.configured_output_chars,
            explicit,
            self.client.input_window(model, advice=True),
            chars_per_token(model),
        )
        return self.max_output_chars

    def _sub_model_now(self) -> tuple[int | None, float]:
        return (
            self.client.input_window(self.sub_model, advice=True),
            chars_per_token(self.sub_model),
        )

    def _chunk_advice(self) -> tuple[str, str]:
        """What one sub-call prompt can hold: the sub-model's window less its answers'
        room, at the characters per token its usage reports showed."""
        window = self.client.input_window(self.sub_model, advice=True)
        return chunk_advice(
            window - answer_room(window, self.max_tokens, self.sub_model) if window else None,
            chars_per_token(self.sub_model),
        )


class _Fields(dict[str, Any]):
    """Format fields for a custom system prompt; unknown {names} stay as written."""

    def __missing__(self, key: str) -> str:
        return "{" + key + "}"
