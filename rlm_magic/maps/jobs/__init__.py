"""Provider batch jobs: a map of many prompts run by the provider within 24 hours, at its
batch price (about half), instead of request by request from the kernel.

The requests are written as one JSONL file, uploaded (litellm's ``acreate_file``), made
into a job (``acreate_batch``) and waited for (``aretrieve_batch``); the output and error
files are then read (``afile_content``) and every line goes back to its prompt's place.

Nothing is paid twice: each job is recorded on disk, under the cache folder, keyed by its
requests (``JobStore``). Running the same map again, after an interrupt or a kernel
restart, finds the record and reattaches to the job instead of submitting a second one.
The record is written before the job is created (a provisional one: the uploaded file,
no job id yet), so a run that died between creating the job and learning its id looks
the job up among the provider's latest jobs (by its input file) before submitting
anything; only a job that the provider made but does not list among its latest 500
could still be submitted twice. A job that failed, expired or was cancelled keeps the answers it
did collect (a ``MapStore`` under the job's key): running the map again submits only the
prompts still without an answer. The records are JSON, never pickle, and live where the
sandbox cannot reach.

The kernel's loop never waits on this work: writing and hashing the file, and reading
and pricing the results, run in a thread; the results are recorded in the ledger in
slices, a loop iteration apart.
"""

from .batch_job import BatchJob
from .files import JobResults
from .providers import BATCH_PROVIDERS, cancel, provider_of
from .records import JobObserver, JobRecord, JobStore

__all__ = [
    "BATCH_PROVIDERS",
    "BatchJob",
    "JobObserver",
    "JobRecord",
    "JobResults",
    "JobStore",
    "cancel",
    "provider_of",
]
