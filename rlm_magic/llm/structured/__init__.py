"""Typed answers: ``response_format=`` turns a model's answer into a validated object.

The format is a pydantic model (notebook side: answers are instances of it) or a JSON
schema (both sides; answers are dicts, what the sandbox can receive). The request sends
the schema itself (the provider's structured-output mode, which llama.cpp and vLLM
enforce with a grammar) where the model takes one: litellm says so
(``litellm.supports_response_schema``), or its server does (the window probe found
llama.cpp or vLLM). A model litellm does not know, at an OpenAI-compatible server of
the user's, is sent the schema too, and in the prompt as well, until its server is
known; a server that refuses the schema is asked again at once in JSON mode with the
schema in the prompt, and so is that model from then on. Whenever the schema is not
sent, a warning says so, once per model (a small model may not follow a schema it only
reads). Every answer is checked here either way: one that does not validate is asked
again once, with the error; a second failure is that item's error, like any failed call.
"""

from __future__ import annotations

from ...errors import ConfigError, InvalidAnswer
from .answer_format import AnswerFormat
from .asking import Typed, ask, prepare, refuses_schema, supports_schema, takes_schema
from .checks import (
    MAX_ANSWER_CHARS,
    MAX_ANSWER_VALUES,
    MAX_CHECK_SECONDS,
    MAX_CHECKS,
    MAX_EXPANDED_NODES,
    MAX_SCHEMA_CHARS,
    MAX_SCHEMA_VALUES,
    Allowance,
    AnswerTooCostly,
)

__all__ = [
    "MAX_ANSWER_CHARS",
    "MAX_ANSWER_VALUES",
    "MAX_CHECKS",
    "MAX_CHECK_SECONDS",
    "MAX_EXPANDED_NODES",
    "MAX_SCHEMA_CHARS",
    "MAX_SCHEMA_VALUES",
    "Allowance",
    "AnswerFormat",
    "AnswerTooCostly",
    "ConfigError",
    "InvalidAnswer",
    "Typed",
    "ask",
    "prepare",
    "refuses_schema",
    "supports_schema",
    "takes_schema",
]
