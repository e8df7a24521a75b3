"""Live progress of a provider batch job: its state and request counts, in the same bar
and text line as any batch (see ``progress``), and the one line an interrupt leaves."""

from __future__ import annotations

import html

from .._tables import html_table, text_table
from ..llm.usage import format_cost
from .progress import BatchProgress


class JobProgress(BatchProgress):
    """A ``BatchProgress`` fed by the job's polls (``JobObserver``) instead of by items."""

    def __init__(self, total: int, label: str = "llm_query_batch", *, enabled: bool = True):
        self.record = None
        super().__init__(total, label, enabled=enabled)

    def job_changed(self, record) -> None:
        self.record = record
        self.done, self.failed = record.kept + record.completed, record.failed

    def line(self, stopped: bool = False) -> str:
        record = self.record
        # Begins as every batch's line does ("<label>: N/M done"), then the job.
        if record is None:
            return (
                f"{self.label}: 0/{self.total} done | batch job: submitting | {self.elapsed_s:.1f}s"
            )
        parts = [
            f"{self.label}: {record.kept + record.completed + record.failed}/{record.total} done",
            f"batch job {record.id} {record.state}" if record.id else "batch job: submitting",
        ]
        if record.failed:
            parts.append(f"{record.failed:,} failed")
        if record.cost_usd is not None:
            parts.append(format_cost(record.cost_usd) + " at batch prices")
        parts.append(f"{self.elapsed_s:.1f}s")
        return " | ".join(parts)


def still_running(record, label: str = "llm_query_batch") -> str:
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

    def __init__(self, records):
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
