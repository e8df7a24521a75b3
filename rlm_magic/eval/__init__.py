"""Does the RLM help, on my model and my data? A built-in evaluation: the RLM against a
direct call and a plain chunked map, on generated long-context tasks, with accuracy,
cost and time.

    from rlm_magic.eval import evaluate
    results = await evaluate(rlm, tasks="niah,count", sizes="8k,64k", n=20)
    results              # the table; results.plot(), results.items, results.to_jsonl(...)

or ``%rlm eval --tasks niah,count --sizes 8k,64k --n 20`` in a notebook. The modules:
``tasks`` (generators, and ``custom_task``), ``scorers``, ``methods``, ``plan`` (the dry
run), ``runner`` and ``results``.
"""

from __future__ import annotations

from . import scorers, tasks
from .methods import DirectMethod, MapMethod, RLMMethod
from .plan import EvalPlan
from .results import EvalResults, ItemResult, wilson
from .runner import Evaluation, evaluate
from .tasks import Item, Task, custom_task

__all__ = [
    "DirectMethod",
    "EvalPlan",
    "EvalResults",
    "Evaluation",
    "Item",
    "ItemResult",
    "MapMethod",
    "RLMMethod",
    "Task",
    "custom_task",
    "evaluate",
    "scorers",
    "tasks",
    "wilson",
]
