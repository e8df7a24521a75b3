"""Reading an OpenAI-style chat completion's body: its text, finish reason and usage."""

from __future__ import annotations

import json
from typing import Any

from .errors import APIError, ResponseHeaders, event_error


def completion_parts(
    raw: bytes, headers: ResponseHeaders | None, api_base: str
) -> tuple[str, Any, Any]:
    """(text, finish reason, usage) of an unstreamed chat completion's body (the reason
    and the usage as the JSON has them)."""
    try:
        data = json.loads(raw)
        if isinstance(data, dict) and "error" in data and "choices" not in data:
            raise event_error(data, headers, api_base)  # an error said with a 200
        choice = data["choices"][0]
        text = (choice.get("message") or {}).get("content") or ""
        return text, choice.get("finish_reason"), data.get("usage")
    except (ValueError, KeyError, IndexError, TypeError, AttributeError):
        raise APIError(
            f"the endpoint's answer is not a chat completion: "
            f"{raw[:200].decode('utf-8', 'replace')}",
            502,
            headers,
            api_base,
        ) from None


_FINISH: dict[Any, Any] = {"stop": "stop", "length": "length", None: None}


def finish_reason_of(reason: Any) -> Any:
    """The finish reason as litellm reports it (``max_tokens`` is "length",
    ``eos_token`` "stop"...), by litellm's own table; remembered per word. (A reason
    litellm cannot map stays as it came, whatever the server sent.)"""
    try:
        known = _FINISH.get(reason, _FINISH)
    except TypeError:  # not a word at all (a broken server's list or object)
        return None
    if known is _FINISH:
        try:
            from litellm.litellm_core_utils.core_helpers import map_finish_reason

            known = map_finish_reason(reason)
        except Exception:  # noqa: BLE001 - as it came
            known = reason
        if len(_FINISH) < 256:
            _FINISH[reason] = known
    return known
