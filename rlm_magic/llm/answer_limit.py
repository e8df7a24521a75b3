"""A request's limit on its answer, whichever of its two names it goes by.

OpenAI's chat API takes the most tokens an answer may have as ``max_tokens`` or, newer,
``max_completion_tokens`` (the only name its o-series and gpt-5 take). rlm-magic sets
``max_tokens`` itself (``RLM.max_tokens``, a sub-call's own, capped at the run's, lowered
to fit a window); a caller may name the limit ``max_completion_tokens`` in
``RLM.litellm_kwargs``. Either way it is one limit: the smaller of the two, sent under
the name the caller used, and read here by whatever reads, caps, holds or fits it, so a
window fitted or a cap applied under one name is not undone under the other.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

NAMES = ("max_tokens", "max_completion_tokens")


def answer_limit(params: Mapping[str, object]) -> int | None:
    """The most answer tokens ``params`` allow: the smaller of the limits they set under
    either name (None: they set none)."""
    limits = _limits(params)
    return min(limits) if limits else None


def answer_limit_at_most(params: Mapping[str, object]) -> int:
    """The most answer tokens a server may take for a request sending ``params``: the
    larger of its limits (a server reads the one it knows), 0 if it sets none."""
    return max(_limits(params), default=0)


def with_answer_limit(params: Mapping[str, Any], tokens: int) -> dict[str, Any]:
    """``params`` limiting the answer to ``tokens`` under one name: the caller's
    ``max_completion_tokens`` if they name it, else ``max_tokens``."""
    name = NAMES[1] if NAMES[1] in params else NAMES[0]
    limited = {key: value for key, value in params.items() if key not in NAMES}
    limited[name] = tokens
    return limited


def one_answer_limit(params: Mapping[str, Any]) -> dict[str, Any]:
    """``params`` as sent: one limit, the smallest they set (as they are if they set
    one name, or none)."""
    if sum(name in params for name in NAMES) < 2:
        return dict(params)
    limit = answer_limit(params)
    return dict(params) if limit is None else with_answer_limit(params, limit)


def _limits(params: Mapping[str, object]) -> list[int]:
    """The limits ``params`` set (a bool, a float or a non-positive number is none)."""
    return [
        value
        for value in (params.get(name) for name in NAMES)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0
    ]
