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

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from ..errors import ConfigError, LLMQueryError, describe_exception
from ..llm.litellm_loader import import_litellm, load_litellm
from ..llm.pricing import batch_rates
from ..llm.usage import CallRecord
from .resume import MapStore

if TYPE_CHECKING:
    from ..llm.client import LLMClient

# Providers whose batch jobs litellm can create (``litellm.acreate_batch``); the first
# ones are named in the error a user of any other provider sees.
BATCH_PROVIDERS = (
    "openai",
    "azure",
    "vertex_ai",
    "bedrock",
    "mistral",
    "litellm_proxy",
    "hosted_vllm",
    "xai",
)
ENDPOINT = "/v1/chat/completions"
ENDED = ("completed", "failed", "expired", "cancelled")
# A job that ended without running everything: a new run keeps what it answered and
# submits a job of the prompts still without an answer.
GAVE_UP = ("failed", "expired", "cancelled")
SUBMITTING = "submitting"  # a provisional record: the file is uploaded, no job id known

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
    def from_json(cls, data: dict) -> JobRecord:
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
        # Written whole, then renamed: a crash mid-write never leaves half a record.
        temporary = self._path(record.key).with_suffix(f".{os.getpid()}.tmp")
        temporary.write_text(json.dumps(asdict(record)))
        os.replace(temporary, self._path(record.key))

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
        matches = [r for r in records if r.id.startswith(job_id)]
        if len(matches) > 1:
            raise ConfigError(
                f"{job_id!r} matches {len(matches)} batch jobs: "
                f"{', '.join(r.id for r in matches)}; give the whole id"
            )
        return matches[0] if matches else None


class JobObserver(Protocol):
    def job_changed(self, record: JobRecord) -> None: ...


def provider_of(litellm, model: str) -> tuple[str, str]:
    """(the model's name at its provider, the provider), or a one-line error when that
    provider cannot run batch jobs."""
    try:
        name, provider, _, _ = litellm.get_llm_provider(model)
    except Exception as exc:  # noqa: BLE001 - litellm's own message says why
        raise ConfigError(
            f"batch_job: cannot tell the provider of {model!r} ({describe_exception(exc)})"
        ) from None
    if provider not in BATCH_PROVIDERS:
        raise ConfigError(
            f"batch_job: {provider} cannot run batch jobs through litellm "
            f"(model {model!r}); providers that can: "
            f"{', '.join(BATCH_PROVIDERS[:6])}"
        )
    return name, provider


# Job creations under way in this process, by key: an interrupted run's creation goes on
# (shielded), and a re-run of the same map waits for it instead of finding no job yet.
_creating: dict[str, asyncio.Future] = {}

_WARM_MODULES = (
    "anyio._backends._asyncio",
    "litellm.files.main",
    "litellm.batches.main",
    "litellm.llms.openai.openai",
    "litellm.llms.github_copilot.per_user_auth",
    "litellm.litellm_core_utils.batch_utils",
)
_warm = False


def warm_up() -> None:
    """Import what litellm imports (and build the pydantic types it builds) on its first
    file and batch calls: done on the loop, that took 50-100 ms stalls. In a thread."""
    global _warm
    if _warm:
        return
    import importlib

    for name in _WARM_MODULES:
        try:
            importlib.import_module(name)
        except Exception:  # noqa: BLE001 - a module this litellm does not have
            pass
    try:
        from litellm.types.llms.openai import OpenAIFileObject
        from litellm.types.utils import LiteLLMBatch

        for model in (LiteLLMBatch, OpenAIFileObject):
            model.model_rebuild()
    except Exception:  # noqa: BLE001 - only a warm-up
        pass
    _warm = True


def write_requests(
    path: Path,
    conversations: Sequence[list[dict]],
    body: dict,
    identity: str,
    redact: Callable[[list[dict]], list[dict]],
) -> str:
    """Write one JSONL line per conversation to ``path`` and return the job's key: a hash
    of every line and of where it goes. Runs in a thread (10,000 lines take ~100 ms)."""
    digest = hashlib.sha256(identity.encode())
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    with open(path, "wb") as out:
        for index, messages in enumerate(conversations):
            line = (
                json.dumps(
                    {
                        "custom_id": str(index),
                        "method": "POST",
                        "url": ENDPOINT,
                        "body": {**body, "messages": redact(messages)},
                    },
                    ensure_ascii=False,
                    sort_keys=True,
                ).encode()
                + b"\n"
            )
            digest.update(line)
            out.write(line)
    return digest.hexdigest()


@dataclass
class JobResults:
    """A job's answers in prompt order (None where an item failed), its per-item errors,
    and one usage record per answered item."""

    texts: list[str | None]
    errors: dict[int, Exception]
    records: list[CallRecord]
    cost_usd: float | None
    answered: list[int] = field(default_factory=list)  # the prompt of each record


def read_results(
    output: bytes | None,
    errors: bytes | None,
    total: int,
    model: str,
    rates: tuple[float, float] | None,
    state: str,
    billed: bool,
) -> JobResults:
    """Every line of the output and error files, in its prompt's place. Runs in a thread."""
    texts: list[str | None] = [None] * total
    failures: dict[int, Exception] = {}
    records: list[CallRecord] = []
    answered: list[int] = []
    cost = 0.0 if rates is not None else None
    for line in (output or b"").splitlines():
        if not line.strip():
            continue
        item = json.loads(line)
        index = int(item.get("custom_id", -1))
        if not 0 <= index < total:
            continue
        response = item.get("response") or {}
        body = response.get("body") or {}
        if response.get("status_code") != 200 or item.get("error"):
            failures[index] = LLMQueryError(model, _line_error(item))
            continue
        try:
            texts[index] = body["choices"][0]["message"].get("content") or ""
        except (KeyError, IndexError, TypeError):
            failures[index] = LLMQueryError(model, "the job's answer had no message")
            continue
        usage = body.get("usage") or {}
        prompt = int(usage.get("prompt_tokens") or 0)
        answer = int(usage.get("completion_tokens") or 0)
        item_cost = None
        if rates is not None:
            item_cost = prompt * rates[0] + answer * rates[1]
            cost += item_cost
        records.append(
            CallRecord(model, prompt, answer, 0.0 if billed else item_cost, cached=billed)
        )
        answered.append(index)
    for line in (errors or b"").splitlines():
        if line.strip():
            item = json.loads(line)
            index = int(item.get("custom_id", -1))
            if 0 <= index < total:
                failures[index] = LLMQueryError(model, _line_error(item))
    for index in range(total):
        if texts[index] is None and index not in failures:
            failures[index] = LLMQueryError(model, f"not run: the batch job ended {state}")
    return JobResults(texts, failures, records, cost, answered)


def _line_error(item: dict) -> str:
    error = item.get("error") or ((item.get("response") or {}).get("body") or {}).get("error")
    status = (item.get("response") or {}).get("status_code")
    message = error.get("message") if isinstance(error, dict) else error
    return f"the batch job's request failed ({status}): {message or 'no reason given'}"


def drop_requests(path: Path, answered: set[int]) -> int:
    """Remove from the request file the lines of prompts already answered; returns how
    many lines are left. Runs in a thread."""
    kept_lines = [
        line
        for line in path.read_bytes().splitlines(keepends=True)
        if int(json.loads(line)["custom_id"]) not in answered
    ]
    path.write_bytes(b"".join(kept_lines))
    return len(kept_lines)


def keep_answers(
    store: MapStore, texts: list[str | None], records: list[CallRecord], indices: list[int]
) -> None:
    """Keep a job's answers on disk (``indices[n]`` is the prompt of ``records[n]``: the
    output file is in the order the provider finished), for a later job of the same map
    to leave out. Runs in a thread."""
    for index, call in zip(indices, records):
        store.add(index, _Kept(texts[index], call.model, call.input_tokens, call.output_tokens))
    store.close()


@dataclass
class _Kept:
    text: str
    model: str
    input_tokens: int
    output_tokens: int


class BatchJob:
    """One map run as a provider batch job: submits it, or reattaches to the job an
    earlier run submitted, and waits for its results on the caller's loop."""

    def __init__(
        self,
        client: LLMClient,
        conversations: Sequence[list[dict]],
        *,
        model: str | None = None,
        params: dict[str, Any] | None = None,
        observer: JobObserver | None = None,
    ):
        self.client = client
        self.config = client.config
        self.conversations = conversations
        self.model = model or self.config.effective_sub_model
        self.params = params or {}
        self.observer = observer
        self.store = JobStore(self.config.cache_dir)
        self.record: JobRecord | None = None
        self.reattached = False
        self.kept: dict[int, dict] = {}

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
        body = {
            "model": self.name,
            "max_tokens": self.params.get("max_tokens") or self.config.max_tokens,
            **self.config.litellm_kwargs,
            **{k: v for k, v in self.params.items() if k != "max_tokens"},
        }
        identity = json.dumps([self.provider, self.config.api_base, ENDPOINT])
        staging = self.store.directory / f"staging-{os.getpid()}-{id(self)}.jsonl"

        def redact(messages):
            return (
                [
                    {**m, "content": redactor(m["content"])}
                    if isinstance(m.get("content"), str)
                    else m
                    for m in messages
                ]
                if redactor
                else messages
            )

        try:
            await asyncio.to_thread(warm_up)
            key = await asyncio.to_thread(
                write_requests, staging, self.conversations, body, identity, redact
            )
            self.answers = MapStore(self.config.cache_dir, f"job-{key}")
            await _creation_done(key)
            record = self.store.get(key)
            if record is not None and record.id is None:
                record = await self._look_up(litellm, record)
            if record is not None and record.state in GAVE_UP:
                if not record.billed:  # its answers were never read: read and keep them
                    self.record = record
                    await self._collect(litellm)
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
        await self._wait(litellm)
        return await self._collect(litellm)

    def _retire(self, record: JobRecord) -> None:
        """Keep a job that gave up in the list (``%rlm jobs``, with its cost) under a key
        of its own: the map's key goes to the job of the prompts it left."""
        self.store.put(JobRecord(**{**asdict(record), "key": f"{record.key}-{record.id}"}))

    async def _patiently(self, what: str, call: Callable[[], Any]):
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

    async def _still_known(self, litellm, record: JobRecord) -> bool:
        """Whether the provider still has the recorded job (a local server restarted, or
        an account changed, forgets it): if not, the map is submitted anew."""
        self.record = record
        try:
            await self._patiently(
                "checking on",
                lambda: litellm.aretrieve_batch(
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

    async def _look_up(self, litellm, record: JobRecord) -> JobRecord | None:
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
                "looking up",
                lambda after=after: litellm.alist_batches(after=after, limit=100, **credentials),
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

    async def _submit(self, litellm, key: str, staging: Path) -> JobRecord:
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

    async def _create(self, litellm, record: JobRecord, credentials) -> JobRecord:
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

    async def _wait(self, litellm) -> None:
        interval = FIRST_POLL_S
        record = self.record
        while not record.ended:
            await asyncio.sleep(interval)
            interval = min(MAX_POLL_S, interval * POLL_GROWTH)
            # Without the flag, litellm's logging prices a finished job itself: it downloads
            # the output file again and walks every line on the loop (seconds for 10,000).
            job = await self._patiently(
                "checking on",
                lambda: litellm.aretrieve_batch(
                    record.id,
                    litellm_metadata={"batch_ignore_default_logging": True},
                    **self._credentials(),
                ),
            )
            if _take_state(record, job):
                self.store.put(record)
                self._changed()

    async def _read_file(self, litellm, file_id: str | None) -> bytes | None:
        if not file_id:
            return None
        credentials = self._credentials()
        found = await self._patiently(
            "reading the results of", lambda: litellm.afile_content(file_id=file_id, **credentials)
        )
        return found.content

    async def _collect(self, litellm) -> JobResults:
        record = self.record
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
        await asyncio.shield(self._settle(results))
        self._changed()
        return self._with_kept(results)

    async def _settle(self, results: JobResults) -> None:
        record = self.record
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
        ledger = self.client.ledger
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
            self.client.ledger.record(
                CallRecord(
                    entry.get("model", self.model),
                    int(entry.get("input_tokens", 0)),
                    int(entry.get("output_tokens", 0)),
                    0.0,
                    cached=True,
                )
            )
        return results

    async def _from_kept(self) -> JobResults:
        return self._with_kept(JobResults([None] * len(self.conversations), {}, [], 0.0))

    def _changed(self) -> None:
        if self.observer is not None and self.record is not None:
            self.observer.job_changed(self.record)


def _take_state(record: JobRecord, job) -> bool:
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


def _created(creation: asyncio.Future) -> None:
    for key, running in list(_creating.items()):
        if running is creation:
            del _creating[key]
    if not creation.cancelled():
        creation.exception()  # retrieved: an interrupted run's failure is no loop warning


async def _creation_done(key: str) -> None:
    creation = _creating.get(key)
    if creation is not None and creation.get_loop() is asyncio.get_running_loop():
        await asyncio.wait([creation])  # its failure is its own run's to report


def cancel(cache_dir: str, job_id: str, config) -> JobRecord:
    """Cancel a recorded job at its provider (blocking: one request, from ``%rlm jobs
    cancel``); returns its record with the state the provider reports."""
    store = JobStore(cache_dir)
    record = store.find(job_id)
    if record is None:
        known = ", ".join(r.id for r in store.all()) or "none"
        raise ConfigError(f"no batch job {job_id!r} recorded (jobs: {known})")
    litellm = import_litellm()
    credentials: dict[str, Any] = {"custom_llm_provider": record.provider}
    if record.api_base:
        credentials["api_base"] = record.api_base
    if config.api_key and record.api_base == config.api_base:
        credentials["api_key"] = config.api_key
    job = litellm.cancel_batch(batch_id=record.id, **credentials)
    # Read again: a cell waiting on the job may have recorded its end (and its billing)
    # meanwhile, which this copy must not overwrite.
    latest = store.get(record.key) or record
    if not latest.ended:
        latest.state = job.status
        store.put(latest)
    return latest
