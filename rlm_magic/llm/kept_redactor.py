"""The redactor of a client's calls, kept while the secrets it removes stay the same:
building one reads the whole environment (~0.2 ms, more than a call's HTTP exchange),
and even finding the configured secrets walks the settings (~30 us a call).

What it is kept by: the settings' revision (it moves on every assignment of a
setting), the text of the settings that hold secrets in place (``litellm_kwargs``,
``model_list``, ``router_settings``: a dict changed in place keeps the revision) and
the environment as it stands (secrets from it, and ``os.environ/NAME`` references)."""

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
        self._kept: tuple[Any, Redactor] | None = None

    def __call__(self, config: RLMConfig) -> Redactor:
        environment = _environment_items()
        # (repr: a dict's text changes with any value in it, at any depth)
        settings = (
            config.revision,
            repr((config.litellm_kwargs, config.model_list, config.router_settings)),
        )
        kept = self._kept
        if kept is not None and environment is not None and kept[0] == (environment, settings):
            return kept[1]
        redactor = Redactor(extra=tuple(config.configured_secrets()))
        self._kept = ((environment, settings), redactor)
        return redactor
