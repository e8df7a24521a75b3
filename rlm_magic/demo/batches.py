"""A provider's batch jobs (OpenAI's Files and Batches APIs), served beside the local
chat server's chat route, so a client's batch jobs run offline over real HTTP.

It knows its server only through ``answer_json`` (``AnswersRequests``): the server
module serves these routes, so this module imports nothing of it."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from typing import Any, Protocol


class AnswersRequests(Protocol):
    """What the batch API needs of its server: each line of a job answered whole."""

    async def answer_json(self, body: dict) -> tuple[int, dict]: ...


class BatchJobsAPI:
    """A provider's batch jobs, played on the server's own loop: a JSONL file of requests
    is uploaded (``POST /v1/files``), a job is made of it (``POST /v1/batches``) and goes
    through ``validating``, ``in_progress`` (each line answered by the server's
    ``answer_json``), ``finalizing`` and ``completed``, leaving an output file and an error
    file (``GET /v1/files/{id}/content``). ``POST /v1/batches/{id}/cancel`` stops it
    (``cancelling``, then ``cancelled`` with what had finished).

    ``step_s`` is the time a job spends in each of validating and finalizing;
    ``hold`` (cleared) keeps jobs in progress until it is set again, and
    ``hold_finalizing`` (cleared) keeps them finalizing; with ``hold_match``
    set, only the lines whose last message contains it wait (the others are answered,
    as a job cancelled or expired half-way leaves some done). For the failures a
    client must survive: ``failing_retrieves`` answers that many job reads with a 503;
    ``lose_created`` makes the next job but answers its creation with a 500 (a lost
    response); ``hold_create`` (cleared) keeps a creation request waiting.
    """

    def __init__(self, server: AnswersRequests, step_s: float = 0.05, concurrency: int = 64):
        self.server = server
        self.concurrency = concurrency
        self.hold = threading.Event()
        self.hold_create = threading.Event()
        self.hold_finalizing = threading.Event()
        self._tasks: set[asyncio.Task] = set()
        # Numbered per kind, from 1 for each server (a notebook run afresh shows the same
        # ids) and never again after a reset: a job still running from before a reset
        # must not take the id of a new file.
        self._ids: dict[str, int] = {}
        self.reset(step_s)

    def reset(self, step_s: float = 0.05) -> None:
        """Forget every file and job (a test's fresh start); jobs run unheld. A job still
        running ends as expired, answering nothing more: an earlier test's job left at
        the provider (an interrupt leaves it there) must not answer into the next test."""
        for batch in getattr(self, "batches", {}).values():
            if batch["status"] in ("validating", "in_progress", "finalizing"):
                batch.update(status="expired", expired_at=int(time.time()))
        self.step_s = step_s
        self.failing_retrieves = 0
        self.lose_created = False
        self.hold_match: str | None = None
        self.hold_create.set()
        self.hold_finalizing.set()
        self.files: dict[str, dict] = {}  # id -> {"meta": {...}, "data": bytes}
        self.batches: dict[str, dict] = {}
        self.hold.set()

    def states(self, job_id: str) -> str | None:
        batch = self.batches.get(job_id)
        return batch["status"] if batch else None

    def add_routes(self, router) -> None:
        router.add_post("/v1/files", self._upload)
        router.add_get("/v1/files/{id}/content", self._content)
        router.add_get("/v1/files/{id}", self._file)
        router.add_post("/v1/batches", self._create)
        router.add_get("/v1/batches", self._list)
        router.add_get("/v1/batches/{id}", self._retrieve)
        router.add_post("/v1/batches/{id}/cancel", self._cancel)

    def _new_id(self, prefix: str) -> str:
        self._ids[prefix] = self._ids.get(prefix, 0) + 1
        return f"{prefix}-{self._ids[prefix]}"

    def _add_file(self, data: bytes, filename: str, purpose: str) -> dict:
        meta: dict[str, Any] = {
            "id": self._new_id("file"),
            "object": "file",
            "bytes": len(data),
            "created_at": int(time.time()),
            "filename": filename,
            "purpose": purpose,
            "status": "processed",
        }
        self.files[meta["id"]] = {"meta": meta, "data": data}
        return meta

    async def _upload(self, request):
        from aiohttp import web

        form = await request.post()
        upload = form.get("file")
        if upload is None or not hasattr(upload, "file"):
            return _error(web, 400, "missing file")
        return web.json_response(
            self._add_file(upload.file.read(), upload.filename or "", str(form.get("purpose", "")))
        )

    async def _file(self, request):
        from aiohttp import web

        found = self.files.get(request.match_info["id"])
        return web.json_response(found["meta"]) if found else _error(web, 404, "No such file")

    async def _content(self, request):
        from aiohttp import web

        found = self.files.get(request.match_info["id"])
        if found is None:
            return _error(web, 404, "No such file")
        return web.Response(body=found["data"], content_type="application/octet-stream")

    async def _create(self, request):
        from aiohttp import web

        body = await request.json()
        # A threading.Event, set from a test's thread: polled, as no asyncio.Event could be.
        while not self.hold_create.is_set():  # noqa: ASYNC110
            await asyncio.sleep(0.01)
        source = self.files.get(body.get("input_file_id", ""))
        if source is None:
            return _error(web, 400, f"No file {body.get('input_file_id')!r}")
        now = int(time.time())
        batch = {
            "id": self._new_id("batch"),
            "object": "batch",
            "endpoint": body.get("endpoint"),
            "errors": None,
            "input_file_id": body["input_file_id"],
            "completion_window": body.get("completion_window", "24h"),
            "status": "validating",
            "output_file_id": None,
            "error_file_id": None,
            "created_at": now,
            "in_progress_at": None,
            "expires_at": now + 86400,
            "finalizing_at": None,
            "completed_at": None,
            "failed_at": None,
            "expired_at": None,
            "cancelling_at": None,
            "cancelled_at": None,
            "request_counts": {"total": 0, "completed": 0, "failed": 0},
            "metadata": body.get("metadata"),
        }
        self.batches[batch["id"]] = batch
        task = asyncio.ensure_future(self._run(batch, source["data"]))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        if self.lose_created:
            self.lose_created = False
            return _error(web, 500, "the connection broke after the job was made")
        return web.json_response(batch)

    async def _retrieve(self, request):
        from aiohttp import web

        if self.failing_retrieves > 0:
            self.failing_retrieves -= 1
            return _error(web, 503, "the service is briefly unavailable")
        batch = self.batches.get(request.match_info["id"])
        return web.json_response(batch) if batch else _error(web, 404, "No such batch")

    async def _list(self, request):
        from aiohttp import web

        return web.json_response(
            {"object": "list", "data": list(self.batches.values()), "has_more": False}
        )

    async def _cancel(self, request):
        from aiohttp import web

        batch = self.batches.get(request.match_info["id"])
        if batch is None:
            return _error(web, 404, "No such batch")
        if batch["status"] in ("validating", "in_progress", "finalizing"):
            batch["status"], batch["cancelling_at"] = "cancelling", int(time.time())
        return web.json_response(batch)

    def _held(self, line: dict) -> bool:
        if self.hold.is_set():
            return False
        if self.hold_match is None:
            return True
        messages = (line.get("body") or {}).get("messages") or [{}]
        return self.hold_match in str(messages[-1].get("content"))

    async def _run(self, batch: dict, data: bytes) -> None:
        await asyncio.sleep(self.step_s)
        try:
            lines = [json.loads(line) for line in data.splitlines() if line.strip()]
        except ValueError as exc:
            batch.update(
                status="failed",
                failed_at=int(time.time()),
                errors={"object": "list", "data": [{"code": "invalid_json", "message": str(exc)}]},
            )
            return
        counts = batch["request_counts"]
        counts["total"] = len(lines)
        if batch["status"] == "validating":
            batch.update(status="in_progress", in_progress_at=int(time.time()))
        outputs: list[bytes] = []
        errors: list[bytes] = []
        slots = asyncio.Semaphore(self.concurrency)

        async def one(line: dict) -> None:
            async with slots:
                # Held by threading.Events a test sets from its own thread: polled.
                while self._held(line) and batch["status"] == "in_progress":  # noqa: ASYNC110
                    await asyncio.sleep(0.01)
                if batch["status"] != "in_progress":
                    return
                body = dict(line.get("body") or {})
                record = {
                    "id": self._new_id("batch_req"),
                    "custom_id": line.get("custom_id"),
                    "error": None,
                }
                status, answer = await self.server.answer_json(body)
                if status != 200:
                    record["response"] = {"status_code": status, "body": answer}
                    errors.append(json.dumps(record).encode())
                    counts["failed"] += 1
                    return
                record["response"] = {
                    "status_code": 200,
                    "request_id": record["id"],
                    "body": answer,
                }
                outputs.append(json.dumps(record).encode())
                counts["completed"] += 1

        await asyncio.gather(*(one(line) for line in lines))
        if batch["status"] == "in_progress":
            batch.update(status="finalizing", finalizing_at=int(time.time()))
            await asyncio.sleep(self.step_s)
            while not self.hold_finalizing.is_set() and batch["status"] == "finalizing":  # noqa: ASYNC110
                await asyncio.sleep(0.01)
        if outputs:
            batch["output_file_id"] = self._add_file(
                b"\n".join(outputs) + b"\n", "output.jsonl", "batch_output"
            )["id"]
        if errors:
            batch["error_file_id"] = self._add_file(
                b"\n".join(errors) + b"\n", "errors.jsonl", "batch_output"
            )["id"]
        if batch["status"] == "cancelling":
            batch.update(status="cancelled", cancelled_at=int(time.time()))
        else:
            batch.update(status="completed", completed_at=int(time.time()))


def _error(web, status: int, message: str):
    return web.json_response(
        {"error": {"message": message, "type": "invalid_request_error"}}, status=status
    )
