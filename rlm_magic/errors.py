"""Every error rlm-magic raises, in one place.

Each class says in one line what went wrong; each message names the model or the
setting involved, so a user can act on it without reading a traceback.

What a user may meet (all ``RLMError``, each shown by IPython as its one line)::

    RLMError
    ├── ConfigError (also a ValueError)  a setting or an argument it cannot use
    ├── LLMQueryError                    a model call failed after its retries
    │   ├── PromptTooLongError           a prompt cannot fit the window; not sent
    │   ├── BudgetExceededError          a call could cost more than a budget has left; not sent
    │   └── APIKeyError (also a ConfigError)  no key for the model, or the key was refused
    ├── CompactionError                  the root conversation cannot be made to fit
    ├── BatchError                       some items failed; .results keeps the others
    ├── RLMRunError                      a run gave no final answer; .result keeps it
    └── SandboxError (a RuntimeError)    the sandbox process could not start or be used

And an interrupt stays a ``KeyboardInterrupt`` (``interrupt``), in one line too.

Signals between rlm-magic's own parts, never shown as they are (each becomes one of the
errors above, or an ``"Error: ..."`` string for model code)::

    RateLimitWaitExceeded   a call waited out rate limits past its time
    StreamStalled           a stream sent nothing for its stall timeout (a TimeoutError)
    AnswerOverBudget        a streamed answer ran past what its budget holds for it
    InvalidAnswer           a typed answer that does not validate (a ValueError)

Three kinds of errors live beside their code, on purpose: the sandbox's (``repl.bridge.
BridgeError``, ``repl.steps.StepInterrupted``), because its worker process imports only
the standard library and the REPL's own modules; and the wire transport's HTTP
failures (``llm.transports.wire.errors``), which copy litellm's class names so that one
set of rules reads both transports' failures.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any, cast

from ._terminal_text import visible


class RLMError(Exception):
    """Base class of every rlm-magic error."""

    def __str__(self) -> str:
        # A message may quote a model's answer, its code's output or a provider's reply:
        # wherever it is printed (IPython, a script's traceback, a client's error line),
        # the control characters in them are shown, not acted on. ``args`` keep the text.
        return visible(super().__str__())

    def _render_traceback_(self) -> list[str]:
        # IPython shows this instead of a traceback through rlm-magic's internals: the
        # message already names the model, the setting or the input at fault.
        return [f"{type(self).__name__}: {self}"]


class ConfigError(RLMError, ValueError):
    """A setting or an argument has a value rlm-magic cannot use."""


class LLMQueryError(RLMError):
    """A model call failed after its retries; carries the model and the cause."""

    # The HTTP status of the failure, where the code raising it sets one (a batch job's
    # calls); read like the providers' own, getattr(error, "status_code", None).
    status_code: int | None = None

    def __init__(self, model: str, cause: BaseException | str, *, retries: int = 0):
        self.model = model
        self.cause = cause
        self.retries = retries
        reason = cause if isinstance(cause, str) else describe_exception(cause)
        tries = f" after {retries + 1} attempts" if retries else ""
        super().__init__(f"LLM call to {model!r} failed{tries}: {reason}")


class PromptTooLongError(LLMQueryError):
    """A prompt cannot fit the model's input window; it was not sent."""

    def __init__(
        self,
        model: str,
        tokens: int,
        room: int,
        *,
        window: int | None = None,
        max_tokens: int | None = None,
        chars_per_token: float = 4.0,
    ):
        self.tokens, self.room = tokens, room
        self.window, self.max_tokens = window, max_tokens
        # Which to cut, with numbers: max_tokens already gave way to the shortest
        # answer (see windows.fit_answer), so the prompt is what must shrink.
        left = (
            f" (its {window:,}-token window less {window - room:,} for the answer)"
            if window
            else ""
        )
        cut = tokens - room
        self.reason = (
            f"prompt is about {tokens:,} tokens, the model takes {room:,}{left}: "
            f"cut the prompt by ~{cut:,} tokens (~{int(cut * chars_per_token):,} "
            "characters); split it"
        )
        super().__init__(model, self.reason)
        self.args = (f"{self.reason} (not sent to {model!r})",)

    def __str__(self) -> str:
        message: str = self.args[0]  # set in __init__
        return message


class BudgetExceededError(LLMQueryError):
    """A call could cost more than a cost budget has left; it was not sent."""

    def __init__(
        self,
        model: str,
        most: float,
        left: float,
        budget: str,
        *,
        why: str = "",
        not_sent: tuple[int, int] | None = None,
    ):
        self.most, self.left, self.budget = most, left, budget
        self.not_sent = not_sent  # (items of a batch not sent, the batch's size)
        super().__init__(model, "not sent")
        batch = (
            f"; {not_sent[0]} of this batch's {not_sent[1]} items were not sent" if not_sent else ""
        )
        self.args = (
            f"not sent to {model!r}: it could cost up to ${most:.4f}{why}, and "
            f"{budget} has ${max(left, 0.0):.4f} left{batch}",
        )

    def __str__(self) -> str:
        message: str = self.args[0]  # set in __init__
        return message


class APIKeyError(LLMQueryError, ConfigError):
    """No API key for a model (found before anything is sent), or the endpoint refused
    the key it was sent (a 401): never retried, one line naming the model, the
    environment variables litellm reads its key from and ``%config RLM.api_key``."""

    status_code = 401

    def __init__(self, model: str, message: str, cause: BaseException | str):
        super().__init__(model, cause)
        self.args = (message,)

    @classmethod
    def missing(
        cls,
        model: str,
        variables: Sequence[str],
        *,
        sent_to: str | None = None,
        cause: BaseException | None = None,
    ) -> APIKeyError:
        where = f" (the server at {sent_to} wants one)" if sent_to else ""
        return cls(
            model,
            f"no API key for {model!r}{where}: {_set_key(variables)}",
            cause if cause is not None else "no API key",
        )

    @classmethod
    def rejected(
        cls,
        model: str,
        failure: BaseException,
        said: str,
        source: str,
        variables: Sequence[str] = (),
    ) -> APIKeyError:
        said = _one_line(said)  # whole: a cut could leave part of a key (redacted later)
        fix = (
            "fix the deployments' api_key"
            if source == "RLM.model_list"
            else _set_key(variables, "a valid key in ")
        )
        return cls(
            model,
            f"the API key from {source} was refused for {model!r} ({said}): {fix}",
            failure,
        )


def _set_key(variables: Sequence[str], what: str = "") -> str:
    named = " or ".join(variables)
    return (
        f"set {what}{named} or %config RLM.api_key = ..."
        if named
        else ("%config RLM.api_key = ...")
    )


class CompactionError(RLMError):
    """The root model's conversation could not be compacted to fit its window."""


class RLMRunError(RLMError):
    """A run did not reach a final answer; ``.result`` holds the partial result."""

    def __init__(self, result: Any, kept_in: str | None = None):  # an RLMResult
        self.result = result
        # One sentence: how the run ended, then why, without the class names of
        # rlm-magic's own errors the cause was described with ("LLMQueryError: ...").
        why = _OWN_ERROR_NAME.sub("", str(result.error or ""), count=1)
        if result.stop_reason == "budget" and not why.startswith("stopped"):
            why = f"stopped by its cost budget: {why}"
        elif result.stop_reason != "budget":
            why = f"{_RUN_ENDS.get(result.stop_reason, 'failed')}: {why}"
        if why == "interrupted: interrupted by the user":
            why = "interrupted by the user"
        kept = f"; the partial result is in {kept_in}" if kept_in else ""
        super().__init__(f"RLM run {why}{kept}")


_RUN_ENDS = {"max_iterations": "ended without an answer", "interrupted": "interrupted"}
_OWN_ERROR_NAME = re.compile(
    r"^(?:RLMError|ConfigError|LLMQueryError|PromptTooLongError|BudgetExceededError|"
    r"CompactionError|BatchError|RLMRunError|SandboxError|APIKeyError): "
)


class RateLimitWaitExceeded(Exception):
    """A call waited for the provider's rate limits longer than ``RLM.rate_limit_wait``
    (or its step's deadline) allows; the client reports it as an ``LLMQueryError``."""


class StreamStalled(TimeoutError):
    """No new token arrived for the stall timeout (or the call's deadline passed); the
    client reports it as an ``LLMQueryError``, keeping the text that had arrived."""


class SandboxError(RLMError, RuntimeError):
    """The sandbox process could not be started or used (a run reports it in
    ``result.error``)."""


class InvalidAnswer(ValueError):
    """A typed answer that is not JSON, or does not match the schema (one line)."""


class AnswerOverBudget(Exception):
    """A streamed answer ran past the output its cost budget holds for it (a server
    that ignores max_tokens, or text denser than counted) and no more could be held:
    the client cuts it there and keeps its text, marked."""


class BatchError(RLMError):
    """Some items of a batch failed; the successful results are kept in ``.results``."""

    def __init__(
        self, results: list[Any], errors: Mapping[int, BaseException], *, kept_in: str = ""
    ):
        # kept_in: an expression that gives this error back, named in the message
        self.results = results
        self.errors = errors
        if not errors:
            super().__init__(
                f"{sum(r is not None for r in results)} of {len(results)} batch items finished"
            )
            return
        first = min(errors)
        super().__init__(
            f"{len(errors)} of {len(results)} batch items failed "
            f"(first: item {first}: {errors[first]}); "
            f"the successful results are in {kept_in}.results, the failures in .errors"
        )


def interrupt(message: str) -> KeyboardInterrupt:
    """A KeyboardInterrupt that IPython shows as one line, ``KeyboardInterrupt: message``,
    like any interrupted cell; a traceback through rlm-magic's helpers (or, for %%rlm,
    through the rewritten cell) would add nothing. It stays a plain KeyboardInterrupt,
    so ``except KeyboardInterrupt`` and clients reading the error's name see one."""
    error = KeyboardInterrupt(message)
    # An attribute IPython looks for, which KeyboardInterrupt does not declare.
    cast(Any, error)._render_traceback_ = lambda: [f"KeyboardInterrupt: {message}"]
    return error


def describe_exception(exc: BaseException, api_base: str | None = None) -> str:
    """A one-line description of ``exc`` that never comes out empty: the kind of failure
    and the provider's own sentence, once. A connection that failed says which endpoint
    could not be reached (``api_base``, or the one litellm names in the exception)."""
    import asyncio

    if isinstance(exc, (asyncio.TimeoutError, TimeoutError)) and not str(exc):
        return "timed out"
    chain = causes(exc)
    if any(_is_connection_failure(e) for e in chain):
        endpoint = api_base or _endpoint_named_in(exc) or "the provider's endpoint"
        reason = _one_line(_ERRNO.sub("", str(chain[-1])))
        return f"could not reach {endpoint}" + (f" ({reason})" if reason else "")
    name = type(exc).__name__
    text = _one_line(str(exc))
    # litellm repeats the kind of failure before the provider's sentence, e.g.
    # "litellm.BadRequestError: ContextWindowExceededError: OpenAIException - request ..."
    while True:
        shorter = _KIND_PREFIX.sub("", text, count=1)
        if shorter == text or not shorter:
            break
        text = shorter
    if not text:
        return name
    if len(text) > 300:
        text = text[:300] + "..."
    return f"{name}: {text}"


_KIND_PREFIX = re.compile(r"^(?:litellm\.)?[A-Z]\w*(?:Error|Exception)\s*(?::|-)\s*")
_ERRNO = re.compile(r"^\[Errno -?\d+\]\s*")
_CONNECTION_FAILURES = {
    "APIConnectionError",
    "ConnectError",
    "ClientConnectorError",
    "ClientConnectorDNSError",
}


def _one_line(text: str) -> str:
    return " ".join(text.split())


def causes(exc: BaseException) -> list[BaseException]:
    """``exc`` and the exceptions it was raised from, outermost first."""
    chain: list[BaseException] = []
    link: BaseException | None = exc
    while link is not None and link not in chain:
        chain.append(link)
        link = link.__cause__ or link.__context__
    return chain


def _is_connection_failure(exc: BaseException) -> bool:
    return isinstance(exc, ConnectionError) or type(exc).__name__ in _CONNECTION_FAILURES


def _endpoint_named_in(exc: BaseException) -> str | None:
    endpoint = getattr(exc, "api_base", None)
    if endpoint:
        return str(endpoint)
    found = re.search(r"API Base: `([^`]+)`", str(getattr(exc, "litellm_debug_info", "")))
    return found.group(1) if found else None
