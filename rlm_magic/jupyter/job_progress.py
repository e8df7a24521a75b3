"""Live progress of a provider batch job: its state and request counts, in the same bar
and text line as any batch (see ``progress``), and the one line an interrupt leaves."""

from __future__ import annotations

import html
from collections.abc import Sequence
from typing import TYPE_CHECKING

from .._tables import html_table, text_table
from ..llm.usage import format_cost
from .progress import BatchProgress
from .status_line import Part

if TYPE_CHECKING:
    from ..maps.jobs import JobRecord


class JobProgress(BatchProgress):
    """A ``BatchProgress`` fed by the job's polls (``JobObserver``) instead of by items."""

    def __init__(self, total: int, label: str = "llm_query_batch", *, enabled: bool = True):
        self.record: JobRecord | None = None
        super().__init__(total, label, enabled=enabled)

    def job_changed(self, record: JobRecord) -> None:
        self.record = record
        self.done, self.failed = record.kept + record.completed, record.failed

    def parts(self, *, stopped: bool = False) -> list[Part]:
        record = self.record
        elapsed = Part(f"{self.elapsed_s:.1f}s")
        # Begins as every batch's line does ("<label>: N/M done"), then the job.
        if record is None:
            done = f"0/{self.total} done"
            return [
                Part(f"{self.label}: {done}", (done,), rank=3),
                Part("batch job: submitting"),
                elapsed,
            ]
        done = f"{record.kept + record.completed + record.failed}/{record.total} done"
        parts = [
            Part(f"{self.label}: {done}", (done,), rank=3),
            Part(f"batch job {record.id} {record.state}", (f"job {record.state}",), rank=2)
            if record.id
            else Part("batch job: submitting"),
        ]
        if record.failed:
            parts.append(Part(f"{record.failed:,} failed"))
        if record.cost_usd is not None:
            cost = format_cost(record.cost_usd)
            parts.append(Part(f"{cost} at batch prices", (cost,), rank=0))
        parts.append(elapsed)
        return parts


def still_running(record: JobRecord, label: str = "llm_query_batch") -> str:
    """What an interrupt says: the job runs on at the provider, and how to get it back."""
    if record.id is None:  # interrupted while the provider was creating it
        return (
            f"{label} interrupted while its batch job was being created (input file "
            f"{record.input_file_id}); the job may be running at the provider: re-run "
            f"the cell to reattach (it is looked up before anything is submitted)"
        )
    return (
        f"{label} interrupted; batch job {record.id} keeps running at the provider: "
        f"re-run the cell to reattach, or `%rlm jobs cancel {record.id}` to cancel it"
    )


class JobsView:
    """``%rlm jobs``: the recorded batch jobs, as last seen, as a table."""

    COLUMNS = ("job", "state", "done", "failed", "cost", "model")

    def __init__(self, records: Sequence[JobRecord]):
        self.records = records

    def _rows(self) -> list[tuple[str, ...]]:
        # Oldest first; the state is as last seen (a run that reattaches refreshes it).
        return [
            (
                r.id or "-",
                r.state,
                f"{r.kept + r.completed + r.failed:,}/{r.total:,}",
                f"{r.failed:,}",
                format_cost(r.cost_usd) if r.cost_usd is not None else "-",
                r.model,
            )
            for r in self.records
        ]

    def __repr__(self) -> str:
        if not self.records:
            return "No batch jobs recorded (llm_query_batch(..., batch_job=True) makes one)."
        return text_table(self.COLUMNS, self._rows(), numbers_right=False)

    def _repr_html_(self) -> str:
        if not self.records:
            return f"<p>{html.escape(repr(self))}</p>"
        # As %rlm jobs always showed it (the example notebooks keep its output).
        return html_table(self.COLUMNS, self._rows(), sections=False)
