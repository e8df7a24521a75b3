"""Reading an OpenAI-style chat completion's body: its text, finish reason and usage."""

from __future__ import annotations

import json
from typing import Any

from ...litellm_loader import imported_litellm
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
# litellm's ``map_finish_reason`` table (1.110), used while litellm is not imported; a
# reason it does not list is "stop", as there.
# (tests/test_wire_transport_matches_litellm.py compares them.)
_LITELLM_FINISH: dict[str, str] = {
    "stop_sequence": "stop",
    "end_turn": "stop",
    "max_tokens": "length",
    "tool_use": "tool_calls",
    "refusal": "content_filter",
    "compaction": "length",
    "pause_turn": "length",
    "model_context_window_exceeded": "length",
    "COMPLETE": "stop",
    "STOP_SEQUENCE": "stop",
    "TOOL_CALL": "tool_calls",
    "ERROR_TOXIC": "content_filter",
    "ERROR": "stop",
    "eos_token": "stop",
    "eos": "stop",
    "STOP": "stop",
    "MAX_TOKENS": "length",
    "CONTINUATION": "length",
    "SAFETY": "content_filter",
    "RECITATION": "content_filter",
    "FINISH_REASON_UNSPECIFIED": "stop",
    "MALFORMED_FUNCTION_CALL": "stop",
    "LANGUAGE": "content_filter",
    "OTHER": "content_filter",
    "BLOCKLIST": "content_filter",
    "PROHIBITED_CONTENT": "content_filter",
    "SPII": "content_filter",
    "IMAGE_SAFETY": "content_filter",
    "IMAGE_PROHIBITED_CONTENT": "content_filter",
    "TOO_MANY_TOOL_CALLS": "stop",
    "MALFORMED_RESPONSE": "stop",
    "NO_IMAGE": "content_filter",
    "IMAGE_RECITATION": "content_filter",
    "IMAGE_OTHER": "content_filter",
    "ESCALATION": "content_filter",
    "UNEXPECTED_TOOL_CALL": "stop",
    "MISSING_THOUGHT_SIGNATURE": "stop",
    "network_error": "stop",
    "sensitive": "content_filter",
    "guardrail_intervened": "content_filter",
    "stop": "stop",
    "length": "length",
    "tool_calls": "tool_calls",
    "function_call": "function_call",
    "content_filter": "content_filter",
    "content_filtered": "content_filter",
    "error": "stop",
}


def finish_reason_of(reason: Any) -> Any:
    """The finish reason as litellm reports it (``max_tokens`` is "length",
    ``eos_token`` "stop"...), by litellm's own table; remembered per word. (A reason
    litellm cannot map stays as it came, whatever the server sent.)"""
    try:
        known = _FINISH.get(reason, _FINISH)
    except TypeError:  # not a word at all (a broken server's list or object)
        return None
    if known is _FINISH:
        if imported_litellm() is None:  # its table, copied: importing it takes seconds
            known = _LITELLM_FINISH.get(reason, "stop") if isinstance(reason, str) else reason
        else:
            try:
                from litellm.litellm_core_utils.core_helpers import map_finish_reason

                known = map_finish_reason(reason)
            except Exception:  # noqa: BLE001 - as it came
                known = reason
        if len(_FINISH) < 256:
            _FINISH[reason] = known
    return known
