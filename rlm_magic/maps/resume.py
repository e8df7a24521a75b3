"""Resumable maps: a long ``llm_query_batch`` keeps its answers on disk as they arrive,
so running it again after an interrupt, a crash or a kernel restart sends only the
prompts that have no answer yet. Nothing already paid for is paid again.

A map is known by its requests (``RequestIdentity.map_key``: model, endpoint, parameters
and every conversation):
the same cell run again finds its own file, a changed prompt list starts afresh. The
file is JSON lines under ``<cache_dir>/maps`` (the sandbox never sees the cache folder,
and JSON is never turned into code). A map that finishes with every answer deletes its
file: from then on, re-running it is the response cache's business (``RLM.cache``).
A function's map (``function_map``) keeps its results here too, those that are JSON.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from ..llm.usage import CallRecord

if TYPE_CHECKING:
    from ..llm.identity import RequestIdentity

# Maps of at least this many prompts resume by default (``resume=None``): they are the
# ones where an interrupt throws away real money. Smaller ones resume with resume=True.
RESUME_AT = 100
# Hashing this many conversations or more happens in a thread, off the kernel's loop.
OFF_LOOP_AT = 2000


# The mark the client puts after an answer that broke off (see client.Completion).
_CUT_MARK = re.compile(r"\n\[answer cut off: [^\n]*\]\Z")


class MapStore:
    """The answers one map has received so far, as JSON lines."""

    def __init__(self, cache_dir: str, key: str):
        self.path = Path(cache_dir) / "maps" / f"{key}.jsonl"
        self._file: TextIO | None = None
        self._broken = False
        self.left_out = 0  # incomplete answers not kept: a re-run asks them again
        self.not_json = 0  # a function map's results that are not JSON: not kept

    @classmethod
    async def open(
        cls,
        cache_dir: str,
        identity: RequestIdentity,
        conversations: Sequence[list[dict[str, Any]]],
    ) -> MapStore:
        """The store of the map of these conversations, asked with this identity."""
        if len(conversations) >= OFF_LOOP_AT:
            key = await asyncio.to_thread(identity.map_key, conversations)
        else:
            key = identity.map_key(conversations)
        return cls(cache_dir, key)

    async def load_kept(self) -> dict[int, dict[str, Any]]:
        """``load``, in a thread when the file is large (10,000 answers: ~30 ms)."""
        try:
            large = self.path.stat().st_size > 1_000_000
        except OSError:
            return {}
        return await asyncio.to_thread(self.load) if large else self.load()

    def load(self) -> dict[int, dict[str, Any]]:
        """Answers kept by earlier runs, by prompt index. A line cut short by a crash is
        skipped: that prompt is simply asked again."""
        kept: dict[int, dict[str, Any]] = {}
        try:
            with open(self.path, encoding="utf-8") as lines:
                for line in lines:
                    try:
                        entry = json.loads(line)
                        text = entry.get("text")
                        if isinstance(text, str) and _CUT_MARK.search(text):
                            continue  # broken off (kept by an older version): ask again
                        kept[int(entry["i"])] = entry
                    except (ValueError, KeyError, TypeError):
                        continue
        except OSError:  # no file yet, or no usable folder: nothing kept
            pass
        return kept

    def add(self, index: int, completion: Any) -> None:
        """Keep one answer, at once: the process may die right after. An incomplete
        answer (cut at max_tokens, broken off by a stall or a deadline) is not kept: a
        re-run asks that prompt again rather than take it as answered."""
        if getattr(completion, "incomplete", False):
            self.left_out += 1
            return
        self._write(
            {
                "i": index,
                "text": completion.text,
                "model": completion.model,
                "input_tokens": completion.input_tokens,
                "output_tokens": completion.output_tokens,
            }
        )

    def add_value(self, index: int, value: Any) -> None:
        """Keep one result of a function's map (``function_map``) if it is JSON, that
        is, comes back from JSON as it went: str, int, float, bool, None, and lists and
        str-keyed dicts of them. Anything else (a tuple, a numpy number, an object) is not
        kept: a re-run calls the function on that item again rather than hand back
        something of another type."""
        if not _is_json(value):
            self.not_json += 1
            return
        self._write({"i": index, "value": value})

    def _write(self, entry: dict[str, Any]) -> None:
        """A disk that fails (full, read-only) must not cost the paid answer: warn
        once, keep none."""
        if self._broken:
            return
        try:
            if self._file is None:
                self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
                self._file = open(self.path, "a", encoding="utf-8")
            self._file.write(json.dumps(entry, ensure_ascii=False) + "\n")
            self._file.flush()
        except OSError as exc:
            self._broken = True
            warnings.warn(
                f"rlm-magic cannot keep this map's answers on disk, going on "
                f"without resuming: {exc}",
                RuntimeWarning,
                stacklevel=2,
            )

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None

    def remove(self) -> None:
        """The map finished: its file goes, unless answers were left out as incomplete
        (then the kept ones stay, and only the incomplete ones are asked again)."""
        self.close()
        if self.left_out:
            return
        try:
            os.unlink(self.path)
        except OSError:  # never written (or the folder is gone): nothing to remove
            pass


def _is_json(value: Any, depth: int = 0) -> bool:
    if type(value) in (str, int, float, bool, type(None)):
        return True
    if depth >= 100:  # as deep as json itself goes comfortably
        return False
    if type(value) is list:
        return all(_is_json(v, depth + 1) for v in value)
    if type(value) is dict:
        return all(type(k) is str and _is_json(v, depth + 1) for k, v in value.items())
    return False


def kept_call(entry: dict[str, Any], model: str) -> CallRecord:
    """A kept answer as the ledger counts it: a cache hit, free this time (``model``:
    the one it was asked of, when an older file did not say)."""
    return CallRecord(
        entry.get("model", model),
        int(entry.get("input_tokens", 0)),
        int(entry.get("output_tokens", 0)),
        0.0,
        cached=True,
    )
