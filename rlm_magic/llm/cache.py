"""An on-disk cache of model answers, so re-running a notebook does not re-bill.

Built on diskcache (SQLite, safe across processes and kernel restarts) rather than
litellm's global ``litellm.cache``: setting that would change caching for every other
litellm user in the kernel, and our own key lets a hit be counted in the ledger.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any


def request_key(request: dict[str, Any]) -> str:
    """A stable key for a request: model, messages and every parameter that shapes
    the answer. Secrets are left out by the caller; they do not change the answer."""
    canonical = json.dumps(request, sort_keys=True, ensure_ascii=False, default=repr)
    return hashlib.sha256(canonical.encode()).hexdigest()


class ResponseCache:
    """Maps request keys to answers (text and token counts)."""

    def __init__(self, directory: str):
        import diskcache  # imported here: only users who turn the cache on pay for it

        self.directory = directory
        self._store = diskcache.Cache(directory)

    def get(self, key: str) -> dict | None:
        return self._store.get(key)

    def set(self, key: str, value: dict) -> None:
        self._store.set(key, value)

    def clear(self) -> None:
        self._store.clear()

    def __len__(self) -> int:
        return len(self._store)

    def close(self) -> None:
        self._store.close()
