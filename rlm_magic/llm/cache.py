"""An on-disk cache of model answers, so re-running a notebook does not re-bill.

One SQLite file (``answers.sqlite3``, standard library only; safe across processes and
kernel restarts) rather than litellm's global ``litellm.cache``: setting that would
change caching for every other litellm user in the kernel, and our own key lets a hit
be counted in the ledger.

Values are stored as JSON and read back only if they have the shape of an answer: the
cache is a file, and nothing read from a file may become code in the kernel. (Earlier
versions used diskcache, which pickles values: its ``cache.db`` in the same folder is
never opened.) The sandbox's filesystem view does not include the cache folder.
"""

from __future__ import annotations

import json
import os
import sqlite3
import warnings
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")

FILE_NAME = "answers.sqlite3"


_warned = False


def safely(method: Callable[..., T], *args: Any) -> T | None:
    """``method(*args)`` on the cache; a cache that fails (disk full, locked) must not
    cost the user a paid answer: warn once, and go on without it (None)."""
    global _warned
    try:
        return method(*args)
    except Exception as exc:  # noqa: BLE001 - any storage error
        if not _warned:
            warnings.warn(
                f"rlm-magic cache is not working, going on without it: {exc}",
                RuntimeWarning,
                stacklevel=2,
            )
            _warned = True
        return None


class ResponseCache:
    """Maps request keys to answers (text, token counts and finish_reason: an answer
    cut at max_tokens is served as cut off, as it came). Keys: ``identity.RequestIdentity``."""

    def __init__(self, directory: str):
        self.directory = directory
        os.makedirs(directory, mode=0o700, exist_ok=True)
        self._db = sqlite3.connect(
            os.path.join(directory, FILE_NAME),
            timeout=30,
            isolation_level=None,
            check_same_thread=False,
        )
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute(
            "CREATE TABLE IF NOT EXISTS answers (key TEXT PRIMARY KEY, value TEXT NOT NULL)"
        )

    def get(self, key: str) -> dict[str, Any] | None:
        row = self._db.execute("SELECT value FROM answers WHERE key = ?", (key,)).fetchone()
        if row is None:
            return None
        try:
            value = json.loads(row[0])
        except (TypeError, ValueError):
            return None
        return value if _is_answer(value) else None

    def set(self, key: str, value: dict[str, Any]) -> None:
        self._db.execute(
            "INSERT OR REPLACE INTO answers VALUES (?, ?)",
            (key, json.dumps(value, ensure_ascii=False)),
        )

    def clear(self) -> None:
        self._db.execute("DELETE FROM answers")

    def __len__(self) -> int:
        count: int = self._db.execute("SELECT COUNT(*) FROM answers").fetchone()[0]
        return count

    def close(self) -> None:
        self._db.close()


def _is_answer(value: Any) -> bool:
    return (
        isinstance(value, dict)
        and isinstance(value.get("text"), str)
        and isinstance(value.get("finish_reason"), (str, type(None)))
        and all(
            isinstance(value.get(k), int) and not isinstance(value.get(k), bool)
            for k in ("input_tokens", "output_tokens")
        )
    )
