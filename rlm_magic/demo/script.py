"""The demo model's script: what the scripted root and sub models answer, and when.

Not a language model. As *root* model it plays one RLM strategy, turn by turn, for
counting questions (look at the context, split it into chunks, fan out with
``llm_query_batch`` or one child RLM per document, add up, ``FINAL_VAR``); as *sub*
model it counts lines and classifies sentiment by rule, and fills a typed answer's
schema with the same rule. ``DemoServer`` picks which of them answers a request and
waits a deterministic time, so concurrency shows in a notebook and re-runs match.
Which log formats the sub model reads a field from is ``log_fields``.

Why one module: what one scripted model answers, root turns and sub-calls
together, since each root turn writes the prompts its sub-calls are answered by.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import re
import threading
from collections import Counter
from typing import Any

from .log_fields import ALIASES, UNDERSTOOD, canonical, field_of
from .server import HTTPError, LocalChatServer, split_tokens


class DemoServer(LocalChatServer):
    """Serves the demo root and sub models, with deterministic latency."""

    def __init__(self, root_latency: float = 0.4, sub_latency: float = 0.25, **kwargs: Any):
        super().__init__(**kwargs)
        self.root_latency = root_latency
        self.sub_latency = sub_latency
        self.prices_registered = threading.Event()

    async def answer(self, body: dict[str, Any]) -> str:
        if not self.prices_registered.is_set():
            # litellm prices a response when it arrives: answer only once it knows the
            # pretend prices (registered in the background by start()).
            await asyncio.get_running_loop().run_in_executor(None, self.prices_registered.wait, 60)
        messages = body.get("messages") or []
        is_rlm_turn = (
            bool(messages)
            and messages[0].get("role") == "system"
            and "Python REPL" in (messages[0].get("content") or "")
        )
        schema = typed_schema(body)
        if is_rlm_turn:
            text = root_reply(messages)
        elif schema:
            text = typed_reply(messages[-1]["content"], schema)
        else:
            text = sub_reply(messages[-1]["content"])
        # Deterministic latency: a fixed base plus up to 40% more, by prompt hash.
        base = self.root_latency if is_rlm_turn else self.sub_latency
        digest = hashlib.sha1(json.dumps(messages).encode()).digest()[0]
        delay = base * (1 + 0.4 * digest / 255)
        if body.get("stream") and is_rlm_turn:
            # A streamed root turn arrives word by word, in the same time in all.
            body["_pace"] = 0.6 * delay / len(split_tokens(text))
            delay *= 0.4
        await asyncio.sleep(delay)
        return text

    def chunk_delay(self, body: dict[str, Any], index: int) -> float:
        return float(body.get("_pace", 0.0))

    def usage_for(self, body: dict[str, Any], text: str) -> tuple[int, int]:
        # A typed request costs the same in JSON mode (the schema in the prompt) as in
        # structured-output mode, so a notebook's figures do not depend on which was used.
        prompt = sum(
            len(_JSON_MODE.sub("", m.get("content") or "")) for m in body.get("messages", [])
        )
        return max(1, prompt // 4), max(1, len(text) // 4)


_JSON_MODE = re.compile(r"\n\nAnswer with JSON only, matching this JSON schema: .*\Z", re.DOTALL)


# Sub-model rules -------------------------------------------------------------------

_COUNT = re.compile(r"Count the lines that contain '([^']+)'(?:, grouped by '([^']+)')?")
_POSITIVE = {
    "good",
    "great",
    "love",
    "excellent",
    "fast",
    "happy",
    "recommend",
    "works",
    "perfect",
    "nice",
    "easy",
    "helpful",
    "amazing",
    "best",
}
_NEGATIVE = {
    "bad",
    "slow",
    "broke",
    "broken",
    "hate",
    "terrible",
    "poor",
    "refund",
    "worst",
    "awful",
    "crash",
    "crashes",
    "late",
    "disappointed",
    "useless",
}


def sub_reply(prompt: str) -> str:
    """Answer a sub-call by rule: counting lines, classifying sentiment, or the questions
    of the evaluation's tasks."""
    evaluated = eval_reply(prompt)
    if evaluated is not None:
        return evaluated
    count = _COUNT.search(prompt)
    if count:
        term, field = count.group(1).lower(), count.group(2)
        text = prompt[count.end() :]
        lines = [line for line in text.splitlines() if term in line.lower()]
        if not field:
            return json.dumps({"count": len(lines)})
        tally: dict[str, int] = {}
        for line in lines:
            value = field_of(line, field)
            if value is not None:
                tally[value] = tally.get(value, 0) + 1
        return json.dumps(dict(sorted(tally.items())))
    if "sentiment" in prompt.lower():
        words = re.findall(r"[a-z']+", prompt.lower().split(":", 1)[-1])
        score = sum(w in _POSITIVE for w in words) - sum(w in _NEGATIVE for w in words)
        return "positive" if score > 0 else "negative" if score < 0 else "neutral"
    length = len(prompt.split())
    return (
        f"[demo model] I only answer counting and sentiment prompts; yours had "
        f"{length} word{'' if length == 1 else 's'}."
    )


def typed_schema(body: dict[str, Any]) -> dict[str, Any] | None:
    """The schema a typed request asks for: in ``response_format`` (structured outputs),
    or in the prompt (JSON mode, as rlm-magic words it)."""
    response_format = body.get("response_format") or {}
    schema = (response_format.get("json_schema") or {}).get("schema")
    if schema is None and response_format.get("type") == "json_object":
        found = re.search(
            r"matching this JSON schema: (\{.*\})\s*$",
            (body.get("messages") or [{}])[-1].get("content") or "",
            re.DOTALL,
        )
        schema = json.loads(found.group(1)) if found else None
    return schema


def typed_reply(prompt: str, schema: dict[str, Any]) -> str:
    """A typed answer (structured outputs): the schema's object, filled in by the
    sentiment rule. An enum takes the label it contains (positive, negative, neutral),
    a number the score, a boolean whether it is positive, a string the words that
    decided."""
    words = re.findall(r"[a-z']+", prompt.lower().split(":", 1)[-1])
    good = [w for w in words if w in _POSITIVE]
    bad = [w for w in words if w in _NEGATIVE]
    score = len(good) - len(bad)
    label = "positive" if score > 0 else "negative" if score < 0 else "neutral"

    def resolve(node: dict[str, Any]) -> dict[str, Any]:
        ref = node.get("$ref", "")
        if ref.startswith("#/$defs/"):
            found: dict[str, Any] = schema.get("$defs", {}).get(ref.rsplit("/", 1)[1], {})
            return found
        return node

    def fill(node: dict[str, Any]) -> Any:
        node = resolve(node)
        if "enum" in node:
            return label if label in node["enum"] else node["enum"][0]
        kind = node.get("type")
        if kind == "object":
            return {name: fill(sub) for name, sub in node.get("properties", {}).items()}
        if kind == "integer":
            return score
        if kind == "number":
            return float(score)
        if kind == "boolean":
            return score > 0
        if kind == "array":
            return good + bad
        return ", ".join(good + bad) or "no telling words"

    return json.dumps(fill(schema))


# Root-model strategy ---------------------------------------------------------------


def _question(messages: list[dict[str, Any]]) -> str:
    first_user = next((m["content"] for m in messages if m.get("role") == "user"), "")
    match = re.search(r"Question: (.*?)\n\nThe data is in", first_user, re.DOTALL)
    return (match.group(1) if match else first_user).strip()


def _task(question: str) -> tuple[str | None, str | None]:
    """(term, field) for questions like: Which service has the most "timeout" lines?"""
    term = re.search(r"[\"“']([^\"”']+)[\"”']", question)
    field = re.search(r"\b(?:which|per|by)\s+([a-z_]+)\b", question, re.I)
    return (term.group(1) if term else None, _singular(field.group(1)) if field else None)


def _singular(word: str) -> str:
    """The field a question's word names: a format's own name for it (``apps`` ->
    ``service``), else the word less a plural's ``s`` (``services`` -> ``service``)."""
    word = word.lower()
    named = canonical(word)
    if named != word or word in ALIASES:
        return named
    return re.sub(r"(?<=[^s])(?:es|s)$", "", word) if word.endswith("s") else word


def _earlier_totals(messages: list[dict[str, Any]]) -> bool:
    """Whether an earlier question of this session left its counts in `totals`."""
    first_user = next((m["content"] for m in messages if m.get("role") == "user"), "")
    return (
        "Earlier questions in this session" in first_user
        and re.search(r"^Variables kept from earlier questions.*\btotals\b", first_user, re.M)
        is not None
    )


def root_reply(messages: list[dict[str, Any]]) -> str:
    """The next move of the demo strategy, from how many turns came before."""
    turn = sum(1 for m in messages if m.get("role") == "assistant")
    question = _question(messages)
    if eval_question(question):
        return eval_root_reply(question, turn)
    term, field = _task(question)
    dict_context = "(dict, length" in (messages[0].get("content") or "")
    if term is None:
        # Refused as a provider refuses a request, so the run fails visibly: an answer
        # saying "I cannot answer" would be shown as a success.
        raise HTTPError(
            400,
            "[demo model] the demo answers counting questions that "
            "quote the term to count, e.g. Which service has the most "
            '"timeout" lines? It is a scripted stand-in: use a real model '
            "for other questions.",
            "invalid_request_error",
        )
    if turn == 0 and _earlier_totals(messages):
        # A follow-up in a session: the counts of the earlier question are in `totals`.
        pick = "ranked[-1]" if re.search(r"\b(?:fewest|least)\b", question, re.I) else "ranked[0]"
        return (
            "The earlier question's counts are still in `totals`: no new sub-calls "
            f"needed.\n```repl\nranked = totals.most_common()\nname, count = {pick}\n"
            f"result = f'{{name}}: {{count}} \"{term}\" lines'\nprint(result)\n```\n"
            "FINAL_VAR(result)"
        )
    if turn == 0:
        return (
            "First I look at the context: its type, size and a sample.\n"
            "```repl\nprint(type(context).__name__, len(context))\n"
            "sample = list(context)[:3] if isinstance(context, dict) else context[:300]\n"
            "print(sample)\n```"
        )
    if dict_context and turn == 1:
        # One child RLM per document: each runs this same strategy on its part.
        return (
            "The context is a set of documents: I give each to a child RLM, "
            "concurrently.\n```repl\nnames = list(context)\n"
            f"answers = rlm_query_batch([{question!r}] * len(names), "
            "[context[n] for n in names])\n"
            "per_document = dict(zip(names, answers))\nprint(per_document)\n```"
        )
    if dict_context:
        return (
            "Each document has its answer.\n```repl\nresult = '; '.join(f'{n}: {a}' "
            "for n, a in per_document.items())\nprint(result)\n```\nFINAL_VAR(result)"
        )
    grouped = f", grouped by '{field}'" if field else ""
    if turn == 1 and field and not _sample_names(messages[-1].get("content") or "", field):
        # The lines shown hold no such field in a format the sub model reads: say so
        # now, as a provider refuses a request, rather than count nothing for 30 turns.
        raise HTTPError(
            400,
            f"[demo model] the demo reads a line's {field!r} from {UNDERSTOOD}; the "
            f"context's first lines show none. Use a real model for other data.",
            "invalid_request_error",
        )
    if turn == 1:
        return (
            "I split the lines into chunks and count in every chunk at once.\n"
            "```repl\nlines = context.splitlines() if isinstance(context, str) "
            "else [str(row) for row in context]\n"
            "size = max(1, min(2000, -(-len(lines) // 16)))\n"
            "chunks = ['\\n'.join(lines[i:i + size]) for i in range(0, len(lines), size)]\n"
            f"prompt = \"Count the lines that contain '{term}'{grouped}. Answer in JSON.\"\n"
            "answers = llm_query_batch([prompt + '\\n\\n' + chunk for chunk in chunks])\n"
            "print(len(chunks), 'chunks;', 'first answers:', answers[:2])\n```"
        )
    return (
        "Now I add up the chunk answers.\n```repl\nfrom collections import Counter\n"
        "totals = Counter()\nfailed = 0\nfor a in answers:\n"
        "    if a.startswith('Error:'):\n        failed += 1\n        continue\n"
        "    totals.update(json.loads(a))\n"
        + (
            f"ranked = totals.most_common()\nresult = ', '.join(f'{{k}}: {{v}}' for k, v "
            f"in ranked)\nresult = f'Most \"{term}\" lines by {field}: ' + result\n"
            f"if not ranked:\n    result = 'No \"{term}\" line names a {field}'\n"
            if field
            else f'result = f\'{{totals["count"]}} lines contain "{term}"\'\n'
        )
        + "if failed:\n    result += f' ({failed} chunks failed)'\nprint(result)\n```\n"
        "FINAL_VAR(result)"
    )


def _sample_names(feedback: str, field: str) -> bool:
    """Whether a line of the context's sample (the first turn's output, a ``str``
    context's start) holds ``field`` in a format the sub model reads. Other contexts
    (a list, a DataFrame's rows) are not judged by their sample."""
    shown = feedback.split("Output of block 1:\n", 1)[-1].split("\n\n", 1)[0]
    kind, _, sample = shown.partition("\n")
    if not kind.startswith("str "):
        return True
    return any(field_of(line, field) is not None for line in sample.splitlines())


# The evaluation's tasks (rlm_magic.eval.tasks) ---------------------------------------
# Answered by rule, so a notebook can run an evaluation offline: the scores then measure
# the harness, never a method. A part of the data answers for itself; a prompt with
# "Answers from the parts:" (the wording of rlm_magic.eval.methods' combining call)
# combines the parts' answers. The first paragraph of a prompt is the question.

_EVAL_NIAH = re.compile(r"special magic number for (\S+?)\?")
_EVAL_COUNT = re.compile(r"How many records have the topic '([^']+)'\?")
_EVAL_MOST = re.compile(r"Which topic do the most records have\?")
_EVAL_COMPARE = re.compile(r"Do more records have the topic '([^']+)' or the topic '([^']+)'\?")
_EVAL_PAIRS = re.compile(
    r"List every pair of users who both have a record with the topic '([^']+)'"
)
_EVAL_TWO_HOP = re.compile(r"headquarters of the company (.+?) works for\?")
_EVAL_QUESTIONS = (_EVAL_NIAH, _EVAL_COUNT, _EVAL_MOST, _EVAL_COMPARE, _EVAL_PAIRS, _EVAL_TWO_HOP)
_EVAL_PARTS = "\nAnswers from the parts:\n"
_NOT_FOUND = "not found"


def eval_question(question: str) -> bool:
    return any(pattern.search(question) for pattern in _EVAL_QUESTIONS)


def eval_reply(prompt: str) -> str | None:
    """The answer to an evaluation task's question about the data in ``prompt`` (or the
    combination of its parts' answers); None for any other prompt."""
    question, _, data = prompt.partition("\n\n")
    if not eval_question(question):
        return None
    if _EVAL_PARTS in prompt:
        answers = prompt.split(_EVAL_PARTS, 1)[1]
        parts = [
            found.strip()
            for found in re.findall(r"^Part \d+: (.*)$", answers, re.M)
            if found.strip().lower() != _NOT_FOUND and not found.startswith("(no answer")
        ]
        return _eval_combine(question, parts)
    return _eval_answer(question, data)


def _eval_answer(question: str, data: str) -> str:
    found = _EVAL_NIAH.search(question)
    if found:
        needle = re.search(rf"special magic number for {re.escape(found.group(1))} is (\d+)", data)
        return needle.group(1) if needle else _NOT_FOUND
    found = _EVAL_COUNT.search(question)
    if found:
        return str(data.count(f"| topic: {found.group(1)} |"))
    tally = Counter(re.findall(r"\| topic: (\w+) \|", data))
    if _EVAL_MOST.search(question):
        return tally.most_common(1)[0][0] if tally else _NOT_FOUND
    found = _EVAL_COMPARE.search(question)
    if found:
        first, second = found.groups()
        return first if tally[first] >= tally[second] else second
    found = _EVAL_PAIRS.search(question)
    if found:
        users = sorted(
            {int(u) for u in re.findall(rf"user (\d+) \| topic: {found.group(1)} \|", data)}
        )
        pairs = [f"{a}-{b}" for i, a in enumerate(users) for b in users[i + 1 :]]
        return ", ".join(pairs) or _NOT_FOUND
    found = _EVAL_TWO_HOP.search(question)
    assert found is not None  # eval_question matched one of them
    works = re.search(rf"{re.escape(found.group(1))} works for ([^.\n]+)\.", data)
    if works is None:
        return _NOT_FOUND
    city = re.search(rf"{re.escape(works.group(1))} has its headquarters in ([^.\n]+)\.", data)
    return city.group(1) if city else _NOT_FOUND


def _eval_combine(question: str, parts: list[str]) -> str:
    if not parts:
        return _NOT_FOUND
    if _EVAL_COUNT.search(question):
        return str(sum(int(n) for part in parts for n in re.findall(r"\d+", part)[:1]))
    if _EVAL_PAIRS.search(question):
        pairs = {pair.strip() for part in parts for pair in part.split(",") if pair.strip()}
        return ", ".join(sorted(pairs))
    if _EVAL_MOST.search(question) or _EVAL_COMPARE.search(question):
        return Counter(parts).most_common(1)[0][0]
    return parts[0]  # a needle, a city: the first part that found it


def eval_root_reply(question: str, turn: int) -> str:
    """The demo's RLM strategy for an evaluation task: the context in chunks, each asked
    the question at once, then one call combining the answers; FINAL_VAR."""
    if turn > 0:
        return "```repl\nprint(answer)\n```\nFINAL_VAR(answer)"
    return (
        "I split the context into chunks, ask each the question, and combine.\n```repl\n"
        "parts, part, size = [], [], 0\n"
        "for line in context.splitlines():\n"
        "    if part and size + len(line) > 60000:\n"
        "        parts.append('\\n'.join(part))\n"
        "        part, size = [], 0\n"
        "    part.append(line)\n"
        "    size += len(line) + 1\n"
        "parts.append('\\n'.join(part))\n"
        f"question = {question!r}\n"
        "answers = llm_query_batch([question + '\\n\\nThe data:\\n' + p for p in parts])\n"
        "listed = '\\n'.join(f'Part {i}: ' + ' '.join(a.split()) "
        "for i, a in enumerate(answers, 1))\n"
        "answer = llm_query(question + '\\n\\nThe data was split into parts.\\n"
        "Answers from the parts:\\n' + listed)\n"
        "print(len(parts), 'parts:', answer)\n```\nFINAL_VAR(answer)"
    )
