"""Every error rlm-magic raises, in one place.

Each class says in one line what went wrong; each message names the model or the
setting involved, so a user can act on it without reading a traceback.
"""

from __future__ import annotations

from typing import Any


class RLMError(Exception):
    """Base class of every rlm-magic error."""

    def _render_traceback_(self) -> list[str]:
        # IPython shows this instead of a traceback through rlm-magic's internals: the
        # message already names the model, the setting or the input at fault.
        return [f"{type(self).__name__}: {self}"]


class ConfigError(RLMError, ValueError):
    """A setting or an argument has a value rlm-magic cannot use."""


class LLMQueryError(RLMError):
    """A model call failed after its retries; carries the model and the cause."""

    def __init__(self, model: str, cause: BaseException | str, *, retries: int = 0):
        self.model = model
        self.cause = cause
        self.retries = retries
        reason = cause if isinstance(cause, str) else describe_exception(cause)
        tries = f" after {retries + 1} attempts" if retries else ""
        super().__init__(f"LLM call to {model!r} failed{tries}: {reason}")


class BatchError(RLMError):
    """Some items of a batch failed; the successful results are kept in ``.results``."""

    def __init__(self, results: list[Any], errors: dict[int, BaseException]):
        self.results = results
        self.errors = errors
        if not errors:
            super().__init__(f"{sum(r is not None for r in results)} of {len(results)} "
                             "batch items finished")
            return
        first = min(errors)
        super().__init__(
            f"{len(errors)} of {len(results)} batch items failed "
            f"(first: item {first}: {errors[first]}); "
            "the successful results are in .results, the failures in .errors"
        )


def describe_exception(exc: BaseException) -> str:
    """A one-line description of ``exc`` that never comes out empty."""
    import asyncio

    if isinstance(exc, (asyncio.TimeoutError, TimeoutError)) and not str(exc):
        return "timed out"
    text = " ".join(str(exc).split())
    name = type(exc).__name__
    if not text:
        return name
    if len(text) > 300:
        text = text[:300] + "..."
    return f"{name}: {text}"
