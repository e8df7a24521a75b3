"""What is known about each provider batch job, kept on disk as JSON: running a map
again finds its job's record and reattaches instead of paying for a second job."""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
import time
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, Protocol

from ...errors import ConfigError

ENDED = ("completed", "failed", "expired", "cancelled")
# A job that ended without running everything: a new run keeps what it answered and
# submits a job of the prompts still without an answer.
GAVE_UP = ("failed", "expired", "cancelled")
SUBMITTING = "submitting"  # a provisional record: the file is uploaded, no job id known


@dataclass
class JobRecord:
    """What is known about one batch job, as last seen; saved as JSON."""

    key: str
    id: str | None  # None while provisional (state SUBMITTING)
    model: str
    provider: str
    api_base: str | None
    total: int
    state: str = "validating"
    completed: int = 0
    failed: int = 0
    cost_usd: float | None = None
    billed: bool = False  # its usage is in a ledger already: a re-read costs nothing
    created_at: float = field(default_factory=time.time)
    input_file_id: str | None = None
    output_file_id: str | None = None
    error_file_id: str | None = None
    kept: int = 0  # answers carried over from earlier jobs of the same map (not rerun)

    @property
    def ended(self) -> bool:
        return self.state in ENDED

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> JobRecord:
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})


class JobStore:
    """Job records, one JSON file each, in ``<cache_dir>/jobs``."""

    def __init__(self, cache_dir: str):
        self.directory = Path(cache_dir) / "jobs"

    def _path(self, key: str) -> Path:
        return self.directory / f"{key}.json"

    def get(self, key: str) -> JobRecord | None:
        try:
            return JobRecord.from_json(json.loads(self._path(key).read_text()))
        except (OSError, ValueError, TypeError):
            return None

    def put(self, record: JobRecord) -> None:
        self.directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        # Written whole, then renamed: a crash mid-write never leaves half a record. Each
        # write gets its own temporary file: `%rlm jobs cancel` (a thread) and the job's own
        # poll (the loop) may write the same record at once in one process.
        handle, temporary = tempfile.mkstemp(dir=self.directory, suffix=".tmp")
        try:
            with os.fdopen(handle, "w") as file:
                file.write(json.dumps(asdict(record)))
            os.replace(temporary, self._path(record.key))
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(temporary)
            raise

    def all(self) -> list[JobRecord]:
        if not self.directory.is_dir():
            return []
        records = [self.get(path.stem) for path in self.directory.glob("*.json")]
        return sorted((r for r in records if r is not None), key=lambda r: r.created_at)

    def find(self, job_id: str) -> JobRecord | None:
        """The record of the job with this id, or of the one job whose id begins with it;
        a prefix that several ids share is an error listing them (every OpenAI batch id
        begins with ``batch_``: the oldest job must never be picked by chance)."""
        records = [r for r in self.all() if r.id]
        exact = [r for r in records if r.id == job_id]
        if exact:
            return exact[-1]
        matches = [r for r in records if str(r.id).startswith(job_id)]
        if len(matches) > 1:
            raise ConfigError(
                f"{job_id!r} matches {len(matches)} batch jobs: "
                f"{', '.join(str(r.id) for r in matches)}; give the whole id"
            )
        return matches[0] if matches else None


class JobObserver(Protocol):
    def job_changed(self, record: JobRecord) -> None: ...


def _take_state(record: JobRecord, job: Any) -> bool:
    """Copy into the record what the provider says of its job (state, counts, result
    files); whether anything changed."""
    counts = getattr(job, "request_counts", None)
    seen = (
        job.status,
        getattr(counts, "completed", 0) or 0,
        getattr(counts, "failed", 0) or 0,
        getattr(job, "output_file_id", None),
        getattr(job, "error_file_id", None),
    )
    if seen == (
        record.state,
        record.completed,
        record.failed,
        record.output_file_id,
        record.error_file_id,
    ):
        return False
    (record.state, record.completed, record.failed, record.output_file_id, record.error_file_id) = (
        seen
    )
    return True
