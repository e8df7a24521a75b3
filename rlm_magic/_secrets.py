"""What counts as a secret, where secrets are found, and how one is shown masked.

Secrets never reach a model nor the model's code: redaction (``llm.redaction``) removes
these values, in the forms they travel in (base64, hex, URL-encoded, spaced...), and the
values of echoed credential headers (``CREDENTIAL_NAMES``), from every prompt, every
output the model reads and every answer or error its code gets, the sandbox's
environment leaves them out, and ``%rlm config`` and ``%config RLM`` show them masked
(a secret setting's value is a ``Secret``, whose repr is masked).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

# A setting or environment variable whose name holds one of these holds a secret.
SECRET_MARKERS = ("KEY", "TOKEN", "SECRET", "PASSWORD", "PASSWD", "CREDENTIAL", "AUTHORIZATION")
# Shorter values ("1", "true") would blank out ordinary text and are not real secrets.
MIN_SECRET_LENGTH = 8
# Headers and settings whose value is a credential whatever it is, as regular expressions
# of the words that end their names (lower case): ``Authorization`` and
# ``Proxy-Authorization``, ``x-api-key``, Azure's ``api-key``, Google's
# ``x-goog-api-key``, ``api_key=`` in a client's repr, ``x-auth-token``, Azure APIM's
# ``Ocp-Apim-Subscription-Key``. An echo of one is redacted even when its value is no
# secret we know (a token from a credentials file).
CREDENTIAL_NAMES = ("authorization", "api[-_]?key", "auth[-_]token", "subscription[-_]key")
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
    """``values`` with every secret masked: under a secret-looking name, at any depth
    (``{"extra_headers": {"Authorization": ...}}`` included)."""
    return {name: _masked(value, looks_secret(name)) for name, value in values.items()}


def _masked(value: Any, secret: bool) -> Any:
    if isinstance(value, Mapping):
        return {k: _masked(v, secret or looks_secret(str(k))) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_masked(v, secret) for v in value)
    if isinstance(value, Secret) or (secret and isinstance(value, str)):
        return value if _is_reference(value) else mask_secret(value)
    return value


class Secret(str):
    """A setting's secret: the string itself wherever it is used (headers, requests),
    masked wherever it is shown by ``repr``: ``%config RLM`` (traitlets prints each
    value's repr), ``%config RLM.api_key`` and a cell's ``Out``, a dict's repr. ``str()``
    of it is the plain secret."""

    __slots__ = ()

    def __repr__(self) -> str:
        return repr(mask_secret(str(self)))

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:  # IPython's display
        printer.text(repr(self))


def hidden(value: Any, secret: bool = False) -> Any:
    """``value`` with every string under a secret-looking name, at any depth, made a
    ``Secret`` (litellm's ``os.environ/NAME`` references stay as they are: names)."""
    if isinstance(value, Mapping):
        return {k: hidden(v, secret or looks_secret(str(k))) for k, v in value.items()}
    if isinstance(value, list):
        return [hidden(v, secret) for v in value]
    if secret and isinstance(value, str) and value and not _is_reference(value):
        return Secret(value)
    return value


def _is_reference(value: str) -> bool:
    return value.startswith(_ENVIRONMENT_REFERENCE)


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
                found.append(str(item))  # a plain str: its repr is the real one

    walk(value, secret)
    return found
