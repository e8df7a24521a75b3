"""rlm-magic: Recursive Language Models in Jupyter.

``%load_ext rlm_magic`` puts awaitable ``llm_query``, ``llm_query_batch``, ``rlm_query``,
``rlm_query_batch`` and ``amap`` into the notebook and registers ``%%rlm`` and ``%rlm``.
Nothing heavy is imported here: litellm loads on the first model call.
"""

from __future__ import annotations

import os

# Before anything imports litellm (rlm-magic on its first call, or the user's own
# `import litellm` after %load_ext): without it, litellm's import fetches its price map
# from the internet (and logs warnings offline). The bundled map is current for our
# pinned range. Setting it imports nothing: loading the extension stays instant.
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

from . import _moved
from ._version import __version__
from .errors import (
    APIKeyError,
    BatchError,
    BudgetExceededError,
    ConfigError,
    LLMQueryError,
    PromptTooLongError,
    RLMError,
    RLMRunError,
)
from .jupyter.helpers import amap, failed_batch, interrupted_batch, unfinished_batch
from .llm.completion import CutAnswer
from .llm.usage import CallRecord, UsageLedger, UsageSummary, usage
from .rlm.result import CodeRun, Compaction, Iteration, RLMResult
from .rlm.runner import RLM
from .rlm.session import RLMSession

_moved.install()  # module paths of earlier versions still import
__all__ = [
    "__version__",
    "RLM",
    "RLMResult",
    "RLMRunError",
    "RLMSession",
    "Iteration",
    "CodeRun",
    "Compaction",
    "RLMError",
    "ConfigError",
    "APIKeyError",
    "LLMQueryError",
    "PromptTooLongError",
    "BudgetExceededError",
    "BatchError",
    "CutAnswer",
    "UsageLedger",
    "UsageSummary",
    "CallRecord",
    "usage",
    "unfinished_batch",
    "interrupted_batch",
    "failed_batch",
    "amap",
    "load_ipython_extension",
    "unload_ipython_extension",
]


def load_ipython_extension(shell: object) -> None:  # an IPython InteractiveShell
    from .jupyter import extension

    extension.load(shell)


def unload_ipython_extension(shell: object) -> None:
    from .jupyter import extension

    extension.unload(shell)
