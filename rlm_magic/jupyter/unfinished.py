"""The last batch that did not finish, as the notebook keeps it: ``unfinished_batch()``.

A batch (``llm_query_batch``, ``rlm_query_batch``, ``amap``, or an ``llm_query`` cut off
mid-answer, a batch of one) does not finish when an interrupt stops it or when some of
its items fail or are not sent (a cost budget). Either way the notebook binds nothing to
a name, so the last such batch is kept here, item by item: what finished, what failed,
what was never sent. ``interrupted_batch()`` and ``failed_batch()``, the two accessors of
earlier versions, still answer for one release, with a ``DeprecationWarning``.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable, Mapping
from typing import Any

from ..errors import BatchError
from ..llm.completion import CutAnswer

# Where the notebook finds the batch again, as messages name it.
KEPT_IN = "rlm_magic.unfinished_batch()"


class UnfinishedBatch(BatchError):
    """A batch that did not finish, item by item (indices in the batch's order):

    - ``results``: each item's result, None where none arrived (an answer an interrupt
      cut off is the ``CutAnswer`` of what had arrived);
    - ``errors``: why each item without a result has none, where there is a why (a
      failure, or what kept it from being sent);
    - ``finished``: the items with a whole result;
    - ``failed``: the items that were sent (their function called) and failed, with
      their errors;
    - ``not_sent``: the items never sent (a budget's refusal, or an interrupt before
      their turn), with the reason where there is one;
    - ``cut_off``: the items an interrupt stopped mid-answer (their part is in
      ``results``); ``cancelled``: those it stopped before anything arrived;
    - ``interrupted``: whether an interrupt stopped it; ``helper``: which helper ran it.

    It is the ``BatchError`` that a batch with failed items raised.
    """

    def __init__(
        self,
        helper: str,
        results: list[Any],
        errors: Mapping[int, BaseException],
        *,
        not_sent: Iterable[int] = (),
        started: Iterable[int] | None = None,
        interrupted: bool = False,
    ):
        super().__init__(results, errors, kept_in=KEPT_IN)
        self.helper, self.interrupted = helper, interrupted
        unsent = set(not_sent)
        self.not_sent: dict[int, BaseException | None] = {
            index: errors.get(index) for index in sorted(unsent)
        }
        self.failed = {i: e for i, e in sorted(errors.items()) if i not in unsent}
        self.cut_off = [i for i, r in enumerate(results) if isinstance(r, CutAnswer)]
        cut = set(self.cut_off)
        self.finished = [i for i, r in enumerate(results) if r is not None and i not in cut]
        begun = set(range(len(results))) if started is None else set(started)
        self.cancelled = [
            i
            for i, r in enumerate(results)
            if interrupted and r is None and i not in errors and i not in unsent and i in begun
        ]
        if not interrupted and errors:
            self.args = (self._failure_message(),)

    def _failure_message(self) -> str:
        parts = []
        if self.failed:
            first = min(self.failed)
            parts.append(
                f"{len(self.failed)} of {len(self.results)} batch items failed "
                f"(first: item {first}: {self.failed[first]})"
            )
        if self.not_sent:
            first = min(self.not_sent)
            count = (
                f"{len(self.not_sent)} were"
                if self.failed
                else (f"{len(self.not_sent)} of {len(self.results)} batch items were")
            )
            parts.append(f"{count} not sent (item {first}: {self.not_sent[first]})")
        return (
            " and ".join(parts) + f"; the successful results are in {KEPT_IN}.results, "
            "why the others have none in .errors"
        )

    def __repr__(self) -> str:
        how = "interrupted" if self.interrupted else "ended"
        return (
            f"<UnfinishedBatch: {self.helper} {how}: {len(self.finished)} finished, "
            f"{len(self.cut_off)} cut off, {len(self.failed)} failed, "
            f"{len(self.cancelled)} cancelled, {len(self.not_sent)} not sent, "
            f"of {len(self.results)}>"
        )


_last: UnfinishedBatch | None = None
# The last of each kind, for the accessors of earlier versions.
_last_interrupted: UnfinishedBatch | None = None
_last_failed: UnfinishedBatch | None = None


def unfinished_batch() -> UnfinishedBatch | None:
    """The last batch that did not finish (interrupted, or with items that failed or were
    not sent), or None: ``.results`` (None where an item has no result), ``.finished``,
    ``.failed``, ``.not_sent``, ``.cut_off``, ``.cancelled`` and ``.errors`` (see
    ``UnfinishedBatch``). An ``llm_query`` cut off mid-answer is a batch of one here:
    ``.results[0]`` is the ``CutAnswer`` it had."""
    return _last


def keep(batch: UnfinishedBatch) -> UnfinishedBatch:
    """Keep ``batch`` as the last that did not finish; returns it."""
    global _last, _last_interrupted, _last_failed
    _last = batch
    if batch.interrupted:
        _last_interrupted = batch
    else:
        _last_failed = batch
    return batch


def interrupted_batch() -> UnfinishedBatch | None:
    """Deprecated: ``unfinished_batch()`` (which also keeps a batch whose items failed).
    The last batch an interrupt stopped, or None."""
    _deprecated("interrupted_batch")
    return _last_interrupted


def failed_batch() -> UnfinishedBatch | None:
    """Deprecated: ``unfinished_batch()`` (which also keeps an interrupted batch). The
    ``BatchError`` of the last batch whose items failed, or None."""
    _deprecated("failed_batch")
    return _last_failed


def _deprecated(name: str) -> None:
    warnings.warn(
        f"rlm_magic.{name}() is deprecated and goes in the next release: use "
        f"{KEPT_IN}, the last batch that did not finish (.finished, .failed, .not_sent)",
        DeprecationWarning,
        stacklevel=3,
    )
