"""What identifies a request's answer, wherever an answer is kept.

Three stores hand back answers without asking the model again: the response cache
(``RLM.cache``), a resumable map's kept answers, and a provider batch job's record. Each
must find an answer only for the very request that made it, or an answer is served
wrongly; and must find it for that request whenever it was made, or it is paid twice.
So all three keys come from one ``RequestIdentity``, built in one place
(``LLMClient.identity``): the model, where its calls go, and every parameter that shapes
the answer. Secrets are never part of it (a new key must not make old answers
unreachable, and a key is no place for one).

The keys keep the layouts of earlier versions, so caches, kept maps and job records
made before still match.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from .answer_limit import one_answer_limit
from .messages import Messages


@dataclass(frozen=True)
class RequestIdentity:
    """The model, its endpoint and the parameters of a request; not its messages."""

    model: str
    # The api_base, or a Router configuration's name (see ``endpoints``).
    endpoint: str | None
    max_tokens: int
    # ``RLM.litellm_kwargs``: temperature, seed... as sent.
    options: dict[str, Any] = field(default_factory=dict)
    # A typed answer's schema (``structured.AnswerFormat.identity``), or None.
    answer_format: str | None = None

    def params(self, response_format: dict[str, Any] | None = None) -> dict[str, Any]:
        """The request's parameters besides model and messages, as sent."""
        params = one_answer_limit({"max_tokens": self.max_tokens, **self.options})
        if response_format is not None:
            params["response_format"] = response_format
        return params

    def cache_key(self, messages: Messages, response_format: dict[str, Any] | None = None) -> str:
        """The response cache's key of one request: these messages as sent."""
        return _digest(
            {
                "model": self.model,
                "messages": messages,
                "api_base": self.endpoint,
                **self.params(response_format),
            }
        )

    def map_key(self, conversations: Sequence[Messages]) -> str:
        """A map's key: every conversation of the map, in order."""
        digest = hashlib.sha256(
            json.dumps(
                {
                    "model": self.model,
                    "api_base": self.endpoint,
                    "max_tokens": self.max_tokens,
                    "options": self.options,
                    "format": self.answer_format,
                },
                sort_keys=True,
                default=repr,
            ).encode()
        )
        for messages in conversations:
            digest.update(json.dumps(messages, sort_keys=True, ensure_ascii=False).encode())
            digest.update(b"\n")
        return digest.hexdigest()

    def job_body(
        self, name_at_provider: str, response_format: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        """The body of each request of a provider batch job, but its messages (the job's
        key is a hash of the file these bodies make)."""
        return {"model": name_at_provider, **self.params(response_format)}


def _digest(value: Any) -> str:
    canonical = json.dumps(value, sort_keys=True, ensure_ascii=False, default=repr)
    return hashlib.sha256(canonical.encode()).hexdigest()
