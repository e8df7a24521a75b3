"""Module paths and names of earlier versions, kept importable for code that used them.

Modules moved to the layer they belong to (see docs/dev/architecture.md). An old path
still imports, with a ``DeprecationWarning`` that names the new one: it is the very
module that holds its names now, or, for a module split in several, a module whose
names are found where each went. ``RLM.helpers`` (the notebook's helpers bound to an
``RLM``) likewise: the notebook layer builds them now, as ``NotebookHelpers(rlm)``.
Nothing inside rlm-magic imports an old path.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import types
import warnings
from typing import Any, cast

# Old path -> the module that is the old module now.
MOVED = {
    "rlm_magic.llm.batch": "rlm_magic.maps.gather",
    "rlm_magic.llm.resume": "rlm_magic.maps.resume",
    "rlm_magic.llm.jobs": "rlm_magic.maps.jobs",
    "rlm_magic.llm.openai_wire": "rlm_magic.llm.transports.wire",
    "rlm_magic.llm.routing": "rlm_magic.llm.transports.router",
}
# Old path -> where each of its names went.
SPLIT = {
    "rlm_magic.rlm.engine": {"RLM": "rlm_magic.rlm.runner", "Run": "rlm_magic.rlm.run"},
    "rlm_magic.llm.transport": {
        "Answer": "rlm_magic.llm.transports.base",
        "LiteLLMTransport": "rlm_magic.llm.transports.litellm",
    },
}


class _OldPaths(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds an old path only when no module of that name exists (it runs after the
    usual finders)."""

    def find_spec(
        self, fullname: str, path: Any = None, target: Any = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname in MOVED or fullname in SPLIT:
            return importlib.util.spec_from_loader(fullname, self)
        return None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        name = spec.name
        if name in MOVED:
            _warn(f"{name} moved to {MOVED[name]}")
            return importlib.import_module(MOVED[name])
        places = SPLIT[name]
        _warn(f"{name} was split: " + ", ".join(f"{n} is in {m}" for n, m in places.items()))
        module = types.ModuleType(name, f"Names of the old {name}, now elsewhere.")

        def __getattr__(attribute: str) -> Any:  # noqa: N807 - the module hook's name
            if attribute not in places:
                raise AttributeError(f"module {name!r} has no attribute {attribute!r}")
            return getattr(importlib.import_module(places[attribute]), attribute)

        module.__getattr__ = __getattr__  # type: ignore[method-assign]
        module.__all__ = list(places)  # type: ignore[attr-defined]
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        pass  # made whole by create_module


def _warn(message: str) -> None:
    warnings.warn(f"{message}; the old path will go", DeprecationWarning, stacklevel=3)


def _notebook_helpers(rlm: Any) -> Any:
    """``RLM.helpers``, as before: the notebook's helpers bound to this RLM."""
    from .jupyter.helpers import NotebookHelpers

    warnings.warn(
        "RLM.helpers is deprecated: use rlm_magic.jupyter.helpers.NotebookHelpers(rlm)",
        DeprecationWarning,
        stacklevel=2,
    )
    return NotebookHelpers(rlm)


def install() -> None:
    """Make the old paths and names importable (once per process)."""
    if not any(isinstance(finder, _OldPaths) for finder in sys.meta_path):
        sys.meta_path.append(_OldPaths())
    from .rlm.runner import RLM

    if not hasattr(RLM, "helpers"):
        cast(Any, RLM).helpers = property(_notebook_helpers)  # (not an attribute RLM declares)
