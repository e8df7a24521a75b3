"""A batch job's files: the JSONL of its requests, written and hashed, and its output and
error files read back into answers in their prompts' places. Each function runs in a
thread: ten thousand lines take ~100 ms, too long for the kernel's loop."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ...errors import LLMQueryError
from ...llm.usage import CallRecord
from ..resume import MapStore

ENDPOINT = "/v1/chat/completions"  # what each request of a job asks for

_WARM_MODULES = (
    "anyio._backends._asyncio",
    "litellm.files.main",
    "litellm.batches.main",
    "litellm.llms.openai.openai",
    "litellm.llms.github_copilot.per_user_auth",
    "litellm.litellm_core_utils.batch_utils",
)
_warm = False


def warm_up() -> None:
    """Import what litellm imports (and build the pydantic types it builds) on its first
    file and batch calls: done on the loop, that took 50-100 ms stalls. In a thread."""
    global _warm
    if _warm:
        return
    import importlib

    for name in _WARM_MODULES:
        try:
            importlib.import_module(name)
        except Exception:  # noqa: BLE001 - a module this litellm does not have
            pass
    try:
        from litellm.types.llms.openai import OpenAIFileObject
        from litellm.types.utils import LiteLLMBatch

        for model in (LiteLLMBatch, OpenAIFileObject):
            model.model_rebuild()
    except Exception:  # noqa: BLE001 - only a warm-up
        pass
    _warm = True


def write_requests(
    path: Path,
    conversations: Sequence[list[dict[str, Any]]],
    body: dict[str, Any],
    destination: str,
    redact: Callable[[list[dict[str, Any]]], list[dict[str, Any]]],
) -> str:
    """Write one JSONL line per conversation to ``path`` and return the job's key: a hash
    of every line (the request's identity and its messages: ``body`` is
    ``RequestIdentity.job_body``) and of where it goes (``destination``). Runs in a
    thread (10,000 lines take ~100 ms)."""
    digest = hashlib.sha256(destination.encode())
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    with open(path, "wb") as out:
        for index, messages in enumerate(conversations):
            line = (
                json.dumps(
                    {
                        "custom_id": str(index),
                        "method": "POST",
                        "url": ENDPOINT,
                        "body": {**body, "messages": redact(messages)},
                    },
                    ensure_ascii=False,
                    sort_keys=True,
                ).encode()
                + b"\n"
            )
            digest.update(line)
            out.write(line)
    return digest.hexdigest()


@dataclass
class JobResults:
    """A job's answers in prompt order (None where an item failed), its per-item errors,
    and one usage record per answered item."""

    texts: list[str | None]
    errors: dict[int, Exception]
    records: list[CallRecord]
    cost_usd: float | None
    answered: list[int] = field(default_factory=list)  # the prompt of each record


def read_results(
    output: bytes | None,
    errors: bytes | None,
    total: int,
    model: str,
    rates: tuple[float, float] | None,
    state: str,
    billed: bool,
) -> JobResults:
    """Every line of the output and error files, in its prompt's place. Runs in a thread."""
    texts: list[str | None] = [None] * total
    failures: dict[int, Exception] = {}
    records: list[CallRecord] = []
    answered: list[int] = []
    cost = 0.0 if rates is not None else None
    for line in (output or b"").splitlines():
        if not line.strip():
            continue
        item = json.loads(line)
        index = int(item.get("custom_id", -1))
        if not 0 <= index < total:
            continue
        response = item.get("response") or {}
        body = response.get("body") or {}
        if response.get("status_code") != 200 or item.get("error"):
            failures[index] = LLMQueryError(model, _line_error(item))
            continue
        try:
            texts[index] = body["choices"][0]["message"].get("content") or ""
        except (KeyError, IndexError, TypeError):
            failures[index] = LLMQueryError(model, "the job's answer had no message")
            continue
        usage = body.get("usage") or {}
        prompt = int(usage.get("prompt_tokens") or 0)
        answer = int(usage.get("completion_tokens") or 0)
        item_cost = None
        if rates is not None:
            item_cost = prompt * rates[0] + answer * rates[1]
            cost = (cost or 0.0) + item_cost
        records.append(
            CallRecord(model, prompt, answer, 0.0 if billed else item_cost, cached=billed)
        )
        answered.append(index)
    for line in (errors or b"").splitlines():
        if line.strip():
            item = json.loads(line)
            index = int(item.get("custom_id", -1))
            if 0 <= index < total:
                failures[index] = LLMQueryError(model, _line_error(item))
    for index in range(total):
        if texts[index] is None and index not in failures:
            failures[index] = LLMQueryError(model, f"not run: the batch job ended {state}")
    return JobResults(texts, failures, records, cost, answered)


def _line_error(item: dict[str, Any]) -> str:
    error = item.get("error") or ((item.get("response") or {}).get("body") or {}).get("error")
    status = (item.get("response") or {}).get("status_code")
    message = error.get("message") if isinstance(error, dict) else error
    return f"the batch job's request failed ({status}): {message or 'no reason given'}"


def drop_requests(path: Path, answered: set[int]) -> int:
    """Remove from the request file the lines of prompts already answered; returns how
    many lines are left. Runs in a thread."""
    kept_lines = [
        line
        for line in path.read_bytes().splitlines(keepends=True)
        if int(json.loads(line)["custom_id"]) not in answered
    ]
    path.write_bytes(b"".join(kept_lines))
    return len(kept_lines)


def keep_answers(
    store: MapStore, texts: list[str | None], records: list[CallRecord], indices: list[int]
) -> None:
    """Keep a job's answers on disk (``indices[n]`` is the prompt of ``records[n]``: the
    output file is in the order the provider finished), for a later job of the same map
    to leave out. Runs in a thread."""
    for index, call in zip(indices, records):
        text = texts[index] or ""  # an answered prompt's text, "" when the model said nothing
        store.add(index, _Kept(text, call.model, call.input_tokens, call.output_tokens))
    store.close()


@dataclass
class _Kept:
    text: str
    model: str
    input_tokens: int
    output_tokens: int
