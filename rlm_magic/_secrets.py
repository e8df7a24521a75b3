"""What counts as a secret, where secrets are found, and how one is shown masked.

Secrets never reach a model nor the model's code: redaction (``llm.redaction``) removes
these values from every prompt and every output the model reads, the sandbox's
environment leaves them out, and ``%rlm config`` shows them masked.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

# A setting or environment variable whose name holds one of these holds a secret.
SECRET_MARKERS = ("KEY", "TOKEN", "SECRET", "PASSWORD", "PASSWD", "CREDENTIAL", "AUTHORIZATION")
# Shorter values ("1", "true") would blank out ordinary text and are not real secrets.
MIN_SECRET_LENGTH = 8
# litellm's way of naming an environment variable in a setting instead of its value.
_ENVIRONMENT_REFERENCE = "os.environ/"


def looks_secret(name: str) -> bool:
    upper = name.upper()
    return any(marker in upper for marker in SECRET_MARKERS)


def mask_secret(value: Any) -> Any:
    """``sk-...wxyz`` for a long secret, ``****`` for a short one; nothing stays nothing."""
    if not value:
        return value
    text = str(value)
    return "****" if len(text) < 12 else f"{text[:3]}...{text[-4:]}"


def masked(values: Mapping[str, Any]) -> dict[str, Any]:
    """``values`` with the value of every secret-looking name masked."""
    return {
        name: mask_secret(value) if looks_secret(name) else value for name, value in values.items()
    }


def environment_secrets() -> tuple[str, ...]:
    """The values of this process's environment variables whose names look secret."""
    return tuple(
        value
        for name, value in os.environ.items()
        if looks_secret(name) and len(value) >= MIN_SECRET_LENGTH
    )


def secrets_in(value: Any, secret: bool = False) -> list[str]:
    """Every secret inside ``value``: the strings under a secret-looking key, at any
    depth of dicts and lists, with litellm's ``os.environ/NAME`` references resolved."""
    found: list[str] = []

    def walk(item: Any, secret: bool) -> None:
        if isinstance(item, Mapping):
            for name, inner in item.items():
                walk(inner, secret or looks_secret(str(name)))
        elif isinstance(item, (list, tuple)):
            for inner in item:
                walk(inner, secret)
        elif secret and isinstance(item, str) and item:
            if item.startswith(_ENVIRONMENT_REFERENCE):
                item = os.environ.get(item[len(_ENVIRONMENT_REFERENCE) :], "")
            if item:
                found.append(item)

    walk(value, secret)
    return found
