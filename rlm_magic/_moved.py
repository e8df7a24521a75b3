"""Module paths and names of earlier versions, kept importable for code that used them.

Modules moved to the layer they belong to (see docs/dev/architecture.md). What an old
path or name gave still comes, with a ``DeprecationWarning`` that says where it is now:

- a module that moved whole (``MOVED``): its old path is the very module it is now;
- names that moved (``NAMES``): the module they were in (a module that is gone, or one
  that is still there) looks each up where it went;
- ``RLM.helpers`` (the notebook's helpers bound to an ``RLM``): the notebook layer builds
  them now, as ``NotebookHelpers(rlm)``.

Nothing inside rlm-magic uses an old path or name.

They go in release ``REMOVED_IN``: every warning names it, and a test fails once the
package's version reaches it while this module is still here, so the end is kept.
"""

from __future__ import annotations

import importlib
import importlib.machinery
import sys
import types
import warnings
from typing import Any, cast

# The release without the old paths and names: one release after they moved (0.1).
REMOVED_IN = "0.2.0"
_GOES = f"removed in rlm-magic {REMOVED_IN}"

# Old path -> the module that is the old module now.
MOVED = {
    "rlm_magic.llm.batch": "rlm_magic.maps.gather",
    "rlm_magic.llm.resume": "rlm_magic.maps.resume",
    "rlm_magic.llm.openai_wire": "rlm_magic.llm.transports.wire",
    "rlm_magic.llm.routing": "rlm_magic.llm.transports.router",
    "rlm_magic.rlm.seen_output": "rlm_magic.rlm.finishing.seen_output",
}
_RATE = "rlm_magic.llm.ratelimit.pacer"
_JOB = "rlm_magic.maps.jobs.batch_job"
# Module -> each name that moved out of it -> "module:name" where it is now.
NAMES: dict[str, dict[str, str]] = {
    # modules that are gone
    "rlm_magic.rlm.engine": {"RLM": "rlm_magic.rlm.runner:RLM", "Run": "rlm_magic.rlm.run:Run"},
    "rlm_magic.llm.transport": {
        "Answer": "rlm_magic.llm.transports.base:Answer",
        "LiteLLMTransport": "rlm_magic.llm.transports.litellm:LiteLLMTransport",
        "close_loop_sessions": "rlm_magic.llm.transports.wire.sessions:close_sessions",
    },
    "rlm_magic.llm.jobs": {
        **{
            name: f"rlm_magic.maps.jobs:{name}"
            for name in ("BatchJob", "JobObserver", "JobRecord", "JobResults", "JobStore")
        },
        **{
            name: f"rlm_magic.maps.jobs.providers:{name}"
            for name in ("BATCH_PROVIDERS", "cancel", "provider_of")
        },
        **{
            name: f"rlm_magic.maps.jobs.records:{name}"
            for name in ("ENDED", "GAVE_UP", "SUBMITTING")
        },
        **{
            name: f"rlm_magic.maps.jobs.files:{name}"
            for name in (
                "ENDPOINT",
                "warm_up",
                "write_requests",
                "read_results",
                "drop_requests",
                "keep_answers",
            )
        },
        **{
            name: f"{_JOB}:{name}"
            for name in (
                "FIRST_POLL_S",
                "MAX_POLL_S",
                "POLL_GROWTH",
                "RECORD_SLICE",
                "POLL_ATTEMPTS",
                "FINAL_STATUSES",
                "LOOKUP_PAGES",
            )
        },
        "batch_rates": "rlm_magic.llm.pricing:batch_rates",
    },
    # modules that are still there
    "rlm_magic.llm.client": {
        "load_litellm": "rlm_magic.llm.litellm_loader:load_litellm",
        "_import_litellm": "rlm_magic.llm.litellm_loader:import_litellm",
        "litellm_is_loading": "rlm_magic.llm.litellm_loader:litellm_is_loading",
        "close_loop_clients": "rlm_magic.llm.transports:close_loop_clients",
        "is_retryable": "rlm_magic.llm.retries:is_retryable",
        "explain_proxy_failure": "rlm_magic.llm.call:explain_proxy_failure",
        "PROXY_COST_HEADER": "rlm_magic.llm.pricing:LITELLM_PROXY_COST_HEADER",
        "_cost_of": "rlm_magic.llm.pricing:cost_of_response",
    },
    "rlm_magic.llm.windows": {
        "forget_learned": "rlm_magic.llm.profiles:forget",
        "CHARS_PER_TOKEN": "rlm_magic.llm.profiles:DEFAULT_CHARS_PER_TOKEN",
    },
    "rlm_magic.llm.local_servers": {"forget": "rlm_magic.llm.profiles:forget"},
    "rlm_magic.llm.cache": {"request_key": "rlm_magic.llm.identity:_digest"},
    "rlm_magic.llm.prompt_cache": {"saving": "rlm_magic.llm.pricing:cache_saving"},
    "rlm_magic.llm.streaming": {"StreamStalled": "rlm_magic.errors:StreamStalled"},
    "rlm_magic.llm.ratelimit": {
        "RateLimitWaitExceeded": "rlm_magic.errors:RateLimitWaitExceeded",
        "DEFAULT_CHARS_PER_TOKEN": "rlm_magic.llm.profiles:DEFAULT_CHARS_PER_TOKEN",
        **{
            name: f"{_RATE}:{name}"
            for name in (
                "FIRST_BLIND_PAUSE_S",
                "MAX_BLIND_PAUSE_S",
                "RATE_DECREASE",
                "SLOW_START_GROWTH",
                "STEADY_GROWTH",
                "CONTRADICTIONS",
                "QUANTIZED_FACTOR",
                "KNEE_GROWTH",
                "ACCEPTED_SHARE",
            )
        },
    },
    "rlm_magic.jupyter.display": {
        name: f"rlm_magic.rlm.render:{name}"
        for name in ("result_html", "result_markdown", "compaction_line")
    },
}


class _OldPaths:
    """A finder and loader of old paths (``sys.meta_path``'s protocol; not its ABCs,
    whose import costs the package's import ~13 ms). It finds an old path only when no
    module of that name exists: it runs after the usual finders."""

    def __init__(self) -> None:
        self._specs: dict[str, importlib.machinery.ModuleSpec | None] = {}

    def find_spec(
        self, fullname: str, path: Any = None, target: Any = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname in MOVED or fullname in NAMES:
            return importlib.machinery.ModuleSpec(fullname, cast(Any, self))  # a Loader by protocol
        return None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        name = spec.name
        if name in MOVED:
            _warn(f"{name} moved to {MOVED[name]}")
            module = importlib.import_module(MOVED[name])
            self._specs[name] = module.__spec__  # put back once the import has run
            return module
        _warn(f"{name} is gone: each of its names says where it went")
        module = types.ModuleType(name, f"Names of the old {name}, now elsewhere.")
        _look_up_moved_names(module, name)
        cast(Any, module).__all__ = list(NAMES[name])
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        # The import machinery gave an alias the old path's spec: the module keeps its own,
        # so that importlib.reload (and %autoreload) still find its file.
        old = module.__spec__.name if module.__spec__ is not None else None
        if old in self._specs:
            module.__spec__ = self._specs.pop(old)
            module.__loader__ = getattr(module.__spec__, "loader", None)


def _look_up_moved_names(module: types.ModuleType, name: str) -> None:
    """``module.<old name>`` (and ``from module import <old name>``) finds it where it
    went, with a warning; every other missing name is an AttributeError, as before."""
    places = NAMES[name]
    existing = module.__dict__.get("__getattr__")

    def __getattr__(attribute: str) -> Any:  # noqa: N807 - the module hook's name
        where = places.get(attribute)
        if where is None:
            if existing is not None:
                return existing(attribute)
            raise AttributeError(f"module {name!r} has no attribute {attribute!r}")
        target, _, new_name = where.partition(":")
        warnings.warn(
            f"{name}.{attribute} moved to {target}.{new_name}; the old name is {_GOES}",
            DeprecationWarning,
            stacklevel=2,
        )
        return getattr(importlib.import_module(target), new_name)

    cast(Any, module).__getattr__ = __getattr__


def _warn(message: str) -> None:
    warnings.warn(f"{message}; the old path is {_GOES}", DeprecationWarning, stacklevel=3)


def _notebook_helpers(rlm: Any) -> Any:
    """``RLM.helpers``, as before: the notebook's helpers bound to this RLM (one each)."""
    from .jupyter.helpers import NotebookHelpers

    warnings.warn(
        f"RLM.helpers is deprecated ({_GOES}): use rlm_magic.jupyter.helpers.NotebookHelpers(rlm)",
        DeprecationWarning,
        stacklevel=2,
    )
    helpers = rlm.__dict__.get("_notebook_helpers")
    if helpers is None:
        helpers = rlm.__dict__["_notebook_helpers"] = NotebookHelpers(rlm)
    return helpers


def install() -> None:
    """Make the old paths and names importable (once per process)."""
    if not any(isinstance(finder, _OldPaths) for finder in sys.meta_path):
        sys.meta_path.append(_OldPaths())
    from .jupyter import display  # noqa: F401 - a small module the package does not load
    from .rlm.runner import RLM

    for name in NAMES:  # the modules still there (those that are gone come by the finder)
        module = sys.modules.get(name)
        if module is not None:
            _look_up_moved_names(module, name)

    if not hasattr(RLM, "helpers"):
        cast(Any, RLM).helpers = property(_notebook_helpers)  # (not an attribute RLM declares)
