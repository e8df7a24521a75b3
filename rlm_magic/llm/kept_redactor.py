"""The redactor of a client's calls, kept while the secrets it removes stay the same:
building one reads the whole environment (~0.2 ms, more than a call's HTTP exchange)."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from .redaction import Redactor

if TYPE_CHECKING:
    from ..config import RLMConfig


def _environment_items() -> tuple[Any, ...] | None:
    """The environment as it stands, cheaply compared (os.environ's own dict; None where
    it has none: then nothing built from it is kept)."""
    data = getattr(os.environ, "_data", None)
    return tuple(data.items()) if isinstance(data, dict) else None


class KeptRedactor:
    """``redactor(config)``: the redactor of the secrets now (see ``LLMClient.redactor``)."""

    def __init__(self) -> None:
        self._kept: tuple[tuple[Any, tuple[str, ...]], Redactor] | None = None

    def __call__(self, config: RLMConfig) -> Redactor:
        extra = tuple(config.configured_secrets())
        environment = _environment_items()
        kept = self._kept
        if kept is not None and environment is not None and kept[0] == (environment, extra):
            return kept[1]
        redactor = Redactor(extra=extra)
        self._kept = ((environment, extra), redactor)
        return redactor
