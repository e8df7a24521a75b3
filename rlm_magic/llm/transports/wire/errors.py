"""The wire transport's errors, as litellm names them: each HTTP failure raises the class
litellm would raise (``RateLimitError``, ``ContextWindowExceededError``...), with its
status code, headers and the provider's own sentence, so the client classifies and
words them the same way whichever transport sent the request."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

# A response's headers as aiohttp gives them (a case-insensitive mapping), or a dict.
ResponseHeaders = Mapping[str, Any]


class _Response:
    def __init__(self, headers: ResponseHeaders):
        self.headers = headers


class WireError(Exception):
    """An HTTP failure, with the status and headers the client's checks read."""

    def __init__(
        self,
        message: str,
        status_code: int | None = None,
        headers: ResponseHeaders | None = None,
        api_base: str | None = None,
    ):
        super().__init__(message)
        self.message, self.status_code, self.api_base = message, status_code, api_base
        self.litellm_response_headers = headers
        self.response = _Response(headers or {})


class BadRequestError(WireError): ...


class ContextWindowExceededError(BadRequestError): ...


class AuthenticationError(WireError): ...


class PermissionDeniedError(WireError): ...


class NotFoundError(WireError): ...


class Timeout(WireError): ...


class UnprocessableEntityError(BadRequestError): ...


class RateLimitError(WireError): ...


class InternalServerError(WireError): ...


class ServiceUnavailableError(WireError): ...


class APIError(WireError): ...


class APIConnectionError(WireError): ...


_BY_STATUS = {
    400: BadRequestError,
    401: AuthenticationError,
    403: PermissionDeniedError,
    404: NotFoundError,
    408: Timeout,
    422: UnprocessableEntityError,
    429: RateLimitError,
    500: InternalServerError,
    503: ServiceUnavailableError,
}
# litellm's list of what providers say when a prompt is over the window.
_CONTEXT_PHRASES = (
    "exceed context limit",
    "this model's maximum context length is",
    "requested token count exceeds the model's maximum context length",
    "model's maximum context limit",
    "is longer than the model's context length",
    "input tokens exceed the configured limit",
    "exceeds the available context size",
    "exceeds the maximum number of tokens allowed",
    '"code": "context_length_exceeded"',
    "context_length_exceeded",
    "prompt is too long",
)


def error_for(
    status: int, body: bytes, headers: ResponseHeaders | None, api_base: str
) -> WireError:
    """The exception litellm would raise for this HTTP answer, with the provider's
    own sentence as its message."""
    message = _message_of(body) or f"Error code: {status}"
    lowered = message.lower()
    kind: type[WireError]
    if status in (400, 413) and any(p in lowered for p in _CONTEXT_PHRASES):
        kind = ContextWindowExceededError
    else:
        kind = _BY_STATUS.get(status, APIError)
    return kind(message, status, headers, api_base)


# The HTTP status an error object's own code or type stands for (a stream's error event
# comes inside a 200 answer).
_STATUS_OF_KIND = {
    "invalid_request_error": 400,
    "context_length_exceeded": 400,
    "bad_request": 400,
    "authentication_error": 401,
    "invalid_api_key": 401,
    "permission_error": 403,
    "permission_denied": 403,
    "not_found_error": 404,
    "model_not_found": 404,
    "rate_limit_error": 429,
    "rate_limit_exceeded": 429,
    "insufficient_quota": 429,
    "overloaded_error": 503,
    "service_unavailable": 503,
    "server_error": 500,
}


def event_error(event: dict[str, Any], headers: ResponseHeaders | None, api_base: str) -> WireError:
    """The exception for an error event inside a stream, by the error's own code or
    type, as ``error_for`` reads an HTTP error (a prompt over the window included)."""
    error = event.get("error")
    status = None
    if isinstance(error, dict):
        for field in ("code", "status", "type"):
            value = error.get(field)
            if isinstance(value, int) or (isinstance(value, str) and value.isdigit()):
                status = int(value)
            elif isinstance(value, str):
                status = _STATUS_OF_KIND.get(value.lower())
            if status is not None and 300 <= status < 600:
                break
            status = None
    return error_for(status or 500, json.dumps(event).encode(), headers, api_base)


def redirect_error(status: int, headers: ResponseHeaders | None, api_base: str) -> APIError:
    """A chat request is never sent on to where a redirect points: its headers (keys)
    and prompt would go to another host."""
    from urllib.parse import urlsplit

    location = (headers or {}).get("Location") or ""
    host = urlsplit(location).hostname or location or "nowhere named"
    return APIError(
        f"the endpoint answered with a redirect ({status}) to {host}; "
        "chat requests are not sent on: set api_base to the endpoint's "
        "own address",
        status,
        headers,
        api_base,
    )


def _message_of(body: bytes) -> str:
    text = body.decode("utf-8", "replace").strip()
    try:
        data = json.loads(text)
    except ValueError:
        return ""  # a page, not an error object: litellm says "Error code: N" too
    if isinstance(data, dict):
        error = data.get("error", data)
        if isinstance(error, dict):
            found = error.get("message") or error.get("detail")
            if found:
                return str(found)
        elif isinstance(error, str):
            return error
        if data.get("detail"):
            return str(data["detail"])
    return text[:1000]


def connection_error(exc: BaseException, api_base: str) -> APIConnectionError:
    return APIConnectionError(str(exc) or type(exc).__name__, None, None, api_base)


# litellm's words for a stream that ended cleanly before its end (a finish reason).
