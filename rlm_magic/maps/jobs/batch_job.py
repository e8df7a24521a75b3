"""A map run as one provider batch job: submitted, or reattached to, and waited for on
the caller's loop; see the package's docstring for how nothing is paid twice."""

from __future__ import annotations

import asyncio
import json
import os
import warnings
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import asdict
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ...errors import ConfigError, LLMQueryError, describe_exception
from ...llm.litellm_loader import load_litellm
from ...llm.pricing import batch_rates
from ...llm.redaction import redact_conversation
from ...llm.usage import UsageLedger
from ..resume import MapStore, kept_call
from .files import (
    ENDPOINT,
    JobResults,
    drop_requests,
    keep_answers,
    read_results,
    warm_up,
    write_requests,
)
from .providers import provider_of
from .records import GAVE_UP, SUBMITTING, JobObserver, JobRecord, JobStore, _take_state

if TYPE_CHECKING:
    from ...llm.client import LLMClient
    from ...llm.identity import RequestIdentity

# Polling: soon at first (a small job can be done in seconds), then less and less often
# (a large one takes hours, and every poll is a request).
FIRST_POLL_S = 1.0
MAX_POLL_S = 60.0
POLL_GROWTH = 1.5
RECORD_SLICE = 1000  # ledger records per loop iteration when results arrive
# A poll (or a read of the results) that fails for a passing reason is tried again this
# many times, backing off from FIRST_POLL_S to MAX_POLL_S: a network blip must not end a
# wait of hours. Statuses that say the request itself is wrong are not tried again.
POLL_ATTEMPTS = 6
FINAL_STATUSES = (400, 401, 403, 404, 422)
# Pages of the provider's job list read to find a job whose creation was not recorded.
LOOKUP_PAGES = 5

# litellm builds these coroutines in a worker thread and awaits them on the loop; one
# cancelled or superseded on the way is reported as never awaited: noise, nothing lost.
warnings.filterwarnings(
    "ignore",
    message=r"coroutine 'OpenAI(Files|Batches)API\.\w+' was "
    r"never awaited",
    category=RuntimeWarning,
)


# Job creations under way in this process, by key: an interrupted run's creation goes on
# (shielded), and a re-run of the same map waits for it instead of finding no job yet.
_creating: dict[str, asyncio.Future[JobRecord]] = {}


class BatchJob:
    """One map run as a provider batch job: submits it, or reattaches to the job an
    earlier run submitted, and waits for its results on the caller's loop."""

    def __init__(
        self,
        client: LLMClient,
        conversations: Sequence[list[dict[str, Any]]],
        identity: RequestIdentity | None = None,
        *,
        response_format: dict[str, Any] | None = None,
        observer: JobObserver | None = None,
        ledger: UsageLedger | None = None,
    ):
        self.client = client
        self.config = client.config
        self.conversations = conversations
        # What the requests are (None: the client's settings as they are now).
        self.identity = identity if identity is not None else client.identity()
        self.model = self.identity.model
        self.response_format = response_format
        self.observer = observer
        self.ledger = ledger if ledger is not None else client.ledger
        self.store = JobStore(self.config.cache_dir)
        self.record: JobRecord | None = None
        self.reattached = False
        self.kept: dict[int, dict[str, Any]] = {}

    def _credentials(self) -> dict[str, Any]:
        # Retries are ours (_patiently): the SDK's own would also retry a job's creation
        # whose answer was lost, and the provider would run (and bill) it twice.
        found: dict[str, Any] = {"custom_llm_provider": self.provider, "max_retries": 0}
        if self.config.api_base:
            found["api_base"] = self.config.api_base
        if self.config.api_key:
            found["api_key"] = self.config.api_key
        return found

    async def run(self) -> JobResults:
        if self.config.model_list:
            raise ConfigError(
                "batch_job: not available with RLM.model_list (a Router "
                "spreads calls over deployments; a job runs at one provider)"
            )
        litellm = await load_litellm()
        self.name, self.provider = provider_of(litellm, self.model)
        redactor = self.client.redactor()
        body = self.identity.job_body(self.name, self.response_format)
        destination = json.dumps([self.provider, self.config.api_base, ENDPOINT])
        staging = self.store.directory / f"staging-{os.getpid()}-{id(self)}.jsonl"

        def redact(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
            return redact_conversation(messages, redactor)

        try:
            await asyncio.to_thread(warm_up)
            key = await asyncio.to_thread(
                write_requests, staging, self.conversations, body, destination, redact
            )
            self.answers = MapStore(self.config.cache_dir, f"job-{key}")
            await _creation_done(key)
            record = self.store.get(key)
            if record is not None and record.id is None:
                record = await self._look_up(litellm, record)
            if record is not None and record.state in GAVE_UP:
                if not record.billed:  # its answers were never read: read and keep them
                    self.record = record
                    await self._collect(litellm, record)
                self._retire(record)
                record = None
            self.kept = await self.answers.load_kept()
            if record is not None and await self._still_known(litellm, record):
                self.record, self.reattached = record, True
            elif len(self.kept) == len(self.conversations):
                self.record = None  # every prompt has its answer from earlier jobs
            else:
                if self.kept:
                    await asyncio.to_thread(drop_requests, staging, set(self.kept))
                self.record = await self._submit(litellm, key, staging)
        finally:
            staging.unlink(missing_ok=True)
        if self.record is None:
            return await self._from_kept()
        self._changed()
        await self._wait(litellm, self.record)
        return await self._collect(litellm, self.record)

    def _retire(self, record: JobRecord) -> None:
        """Keep a job that gave up in the list (``%rlm jobs``, with its cost) under a key
        of its own: the map's key goes to the job of the prompts it left."""
        self.store.put(JobRecord(**{**asdict(record), "key": f"{record.key}-{record.id}"}))

    async def _patiently(self, what: str, call: Callable[[], Awaitable[Any]]) -> Any:
        """``call()``, tried again with backoff when it fails for a passing reason (the
        network, a 5xx, a 429); a final failure is one line naming the job."""
        delay = FIRST_POLL_S
        for attempt in range(POLL_ATTEMPTS):
            try:
                return await call()
            except Exception as exc:  # noqa: BLE001 - sorted below, and said in one line
                status = getattr(exc, "status_code", None)
                if status in FINAL_STATUSES or attempt == POLL_ATTEMPTS - 1:
                    raise self._lost_touch(what, exc) from None
            await asyncio.sleep(delay)
            delay = min(MAX_POLL_S, delay * 2)

    def _lost_touch(self, what: str, exc: Exception) -> LLMQueryError:
        job = self.record.id if self.record is not None and self.record.id else "(being submitted)"
        error = LLMQueryError(
            self.model,
            f"{what} batch job {job} failed "
            f"({describe_exception(exc)}); the job may still "
            f"be running at the provider: re-run the cell to "
            f"reattach",
        )
        error.status_code = getattr(exc, "status_code", None)
        return error

    async def _still_known(self, litellm: Any, record: JobRecord) -> bool:
        """Whether the provider still has the recorded job (a local server restarted, or
        an account changed, forgets it): if not, the map is submitted anew."""
        self.record = record
        try:
            await self._patiently(
                "checking on",
                partial(
                    asyncio.to_thread,
                    litellm.retrieve_batch,
                    record.id,
                    litellm_metadata={"batch_ignore_default_logging": True},
                    **self._credentials(),
                ),
            )
        except LLMQueryError as error:  # only "not found" means forgotten
            if error.status_code == 404:
                return False
            raise
        return True

    async def _look_up(self, litellm: Any, record: JobRecord) -> JobRecord | None:
        """A provisional record: an earlier run uploaded the file and may have created
        the job without learning its id (its kernel died, or the answer was lost). Find
        the job among the provider's latest (LOOKUP_PAGES pages, newest first) by its
        input file, which is this upload's alone (an earlier job of the same map that
        gave up has the same key in its metadata); None if it is not there: then nothing
        was created, and submitting is safe."""
        after = None
        credentials = self._credentials()
        for _ in range(LOOKUP_PAGES):
            page = await self._patiently(
                "looking up", partial(litellm.alist_batches, after=after, limit=100, **credentials)
            )
            jobs = list(getattr(page, "data", None) or [])
            for job in jobs:
                if getattr(job, "input_file_id", None) == record.input_file_id:
                    # All it says, not only its state: a job found already ended is never
                    # polled, and its output file is known from this answer alone.
                    record.id = job.id
                    _take_state(record, job)
                    self.store.put(record)
                    return record
            if not jobs or not getattr(page, "has_more", False):
                break
            after = jobs[-1].id
        return None

    async def _submit(self, litellm: Any, key: str, staging: Path) -> JobRecord:
        data = await asyncio.to_thread(staging.read_bytes)
        credentials = self._credentials()
        upload = {"file": ("requests.jsonl", data), "purpose": "batch", **credentials}
        del data
        uploaded = await self._patiently(
            "uploading the requests of", lambda: litellm.acreate_file(**upload)
        )
        upload.clear()  # the file's bytes go now, not when the job has ended
        # Recorded before the job is made: a run that dies before it learns the job's id
        # leaves this, and the next one looks the job up instead of paying for another.
        self.record = JobRecord(
            key,
            None,
            self.model,
            self.provider,
            self.config.api_base,
            len(self.conversations),
            state=SUBMITTING,
            input_file_id=uploaded.id,
            kept=len(self.kept),
        )
        self.store.put(self.record)
        # Shielded: once the provider has the job, it is recorded even if this run is
        # interrupted meanwhile.
        creation = asyncio.ensure_future(self._create(litellm, self.record, credentials))
        _creating[key] = creation
        creation.add_done_callback(_created)
        return await asyncio.shield(creation)

    async def _create(
        self, litellm: Any, record: JobRecord, credentials: dict[str, Any]
    ) -> JobRecord:
        try:
            job = await litellm.acreate_batch(
                completion_window="24h",
                endpoint=ENDPOINT,
                input_file_id=record.input_file_id,
                metadata={"rlm_magic_key": record.key[:32]},
                **credentials,
            )
        except Exception as exc:  # noqa: BLE001 - the provider may have made it anyway
            raise LLMQueryError(
                self.model,
                f"creating the batch job failed "
                f"({describe_exception(exc)}); if the provider "
                f"made it, re-running the cell finds it (it "
                f"is looked up before anything is submitted)",
            ) from None
        record.id, record.state = job.id, job.status
        self.store.put(record)
        return record

    async def _wait(self, litellm: Any, record: JobRecord) -> None:
        interval = FIRST_POLL_S
        while not record.ended:
            await asyncio.sleep(interval)
            interval = min(MAX_POLL_S, interval * POLL_GROWTH)
            # Without the flag, litellm's logging prices a finished job itself: it downloads
            # the output file again and walks every line on the loop (seconds for 10,000).
            job = await self._patiently(
                "checking on",
                partial(
                    asyncio.to_thread,
                    litellm.retrieve_batch,
                    record.id,
                    litellm_metadata={"batch_ignore_default_logging": True},
                    **self._credentials(),
                ),
            )
            if _take_state(record, job):
                self.store.put(record)
                self._changed()

    async def _read_file(self, litellm: Any, file_id: str | None) -> bytes | None:
        if not file_id:
            return None
        credentials = self._credentials()
        found = await self._patiently(
            "reading the results of", lambda: litellm.afile_content(file_id=file_id, **credentials)
        )
        content: bytes = found.content
        return content

    async def _collect(self, litellm: Any, record: JobRecord) -> JobResults:
        output = await self._read_file(litellm, record.output_file_id)
        errors = await self._read_file(litellm, record.error_file_id)
        rates = await asyncio.to_thread(batch_rates, litellm, self.name, self.provider)
        results = await asyncio.to_thread(
            read_results,
            output,
            errors,
            record.total,
            self.model,
            rates,
            record.state,
            record.billed,
        )
        # Shielded: the job is billed once in the record and once in the ledger, even if
        # an interrupt lands between the two.
        await asyncio.shield(self._settle(record, results))
        self._changed()
        return self._with_kept(results)

    async def _settle(self, record: JobRecord, results: JobResults) -> None:
        if not record.billed:
            if record.state in GAVE_UP:  # the next run submits only what is unanswered
                await asyncio.to_thread(
                    keep_answers, self.answers, results.texts, results.records, results.answered
                )
            # Saved before the ledger hears of it: a crash in between under-counts once
            # rather than charging the job again on every re-read.
            record.billed, record.cost_usd = True, results.cost_usd
            record.completed = len(results.records)
            record.failed = record.total - record.kept - record.completed
            self.store.put(record)
        ledger = self.ledger
        for start in range(0, len(results.records), RECORD_SLICE):
            for call in results.records[start : start + RECORD_SLICE]:
                ledger.record(call)
            await asyncio.sleep(0)

    def _with_kept(self, results: JobResults) -> JobResults:
        """The answers earlier jobs of this map kept, in their places; they cost nothing
        this time (cache hits in the ledger)."""
        for index, entry in self.kept.items():
            results.texts[index] = entry["text"]
            results.errors.pop(index, None)
            self.ledger.record(kept_call(entry, self.model))
        return results

    async def _from_kept(self) -> JobResults:
        return self._with_kept(JobResults([None] * len(self.conversations), {}, [], 0.0))

    def _changed(self) -> None:
        if self.observer is not None and self.record is not None:
            self.observer.job_changed(self.record)


def _created(creation: asyncio.Future[JobRecord]) -> None:
    for key, running in list(_creating.items()):
        if running is creation:
            del _creating[key]
    if not creation.cancelled():
        creation.exception()  # retrieved: an interrupted run's failure is no loop warning


async def _creation_done(key: str) -> None:
    creation = _creating.get(key)
    if creation is not None and creation.get_loop() is asyncio.get_running_loop():
        await asyncio.wait([creation])  # its failure is its own run's to report
