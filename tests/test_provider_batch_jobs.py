"""Provider batch jobs (``llm_query_batch(..., batch_job=True)``) against the local
server's Files + Batches API, through litellm over HTTP."""

from __future__ import annotations

import asyncio
import importlib
import inspect
import json
import signal
import subprocess
import sys
import textwrap
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from rlm_magic import RLM, BatchError
from rlm_magic.errors import ConfigError, LLMQueryError
from rlm_magic.jupyter.extension import session_rlm
from rlm_magic.maps import jobs
from rlm_magic.maps.jobs import BatchJob, JobStore, batch_job

from .support import cell_result, helpers, make_rlm, run_cell


@pytest.fixture
def rlm(batch_server, tmp_path):
    return make_rlm(batch_server, cache_dir=str(tmp_path))


class Seen:
    def __init__(self):
        self.states: list[str] = []

    def job_changed(self, record):
        if not self.states or self.states[-1] != record.state:
            self.states.append(record.state)


def conversations(prompts):
    return [[{"role": "user", "content": p}] for p in prompts]


async def job_in_progress(server) -> str:
    def found():
        return any(b["status"] == "in_progress" for b in server.batch_jobs.batches.values())

    assert await asyncio.to_thread(server.wait_for, found, 30)
    return next(iter(server.batch_jobs.batches))


async def test_a_batch_job_goes_through_the_providers_states_and_answers_in_order(
    rlm, batch_server
):
    # Each state held until the client has seen it: a poll late on a loaded machine
    # must not skip one. (A job's creation answers "validating".)
    batch_server.batch_jobs.hold.clear()
    batch_server.batch_jobs.hold_finalizing.clear()
    seen = Seen()
    job = BatchJob(rlm.client, conversations([f"p{i}" for i in range(5)]), observer=seen)
    running = asyncio.ensure_future(job.run())
    await job_in_progress(batch_server)
    await asyncio.to_thread(batch_server.wait_for, lambda: "in_progress" in seen.states)
    batch_server.batch_jobs.hold.set()
    await asyncio.to_thread(batch_server.wait_for, lambda: "finalizing" in seen.states)
    batch_server.batch_jobs.hold_finalizing.set()
    results = await running
    assert results.texts == [f"echo: p{i}" for i in range(5)]
    assert seen.states == ["validating", "in_progress", "finalizing", "completed"]
    # One upload, one job, and each line answered once by the provider, not the kernel.
    assert len(batch_server.batch_jobs.batches) == 1
    assert len(batch_server.requests) == 5


async def test_failed_lines_are_per_item_errors_and_the_others_are_kept(rlm, batch_server):
    batch_server.fail("500", times=1, match="bad")
    with pytest.raises(BatchError) as caught:
        await helpers(rlm).llm_query_batch(["ok1", "bad", "ok2"], batch_job=True)
    assert caught.value.results == ["echo: ok1", None, "echo: ok2"]
    assert list(caught.value.errors) == [1]
    assert "injected server error" in str(caught.value.errors[1])


async def test_usage_is_priced_at_the_providers_batch_prices(batch_server, tmp_path):
    rlm = make_rlm(batch_server, cache_dir=str(tmp_path), sub_model="openai/gpt-4o-mini")
    await helpers(rlm).llm_query_batch(["a", "b"], batch_job=True)
    records = rlm.client.ledger.records
    assert [(r.input_tokens, r.output_tokens) for r in records] == [(10, 5), (10, 5)]
    # litellm's price map: $0.075 / $0.30 per million tokens in a batch (half of $0.15 / $0.60).
    assert records[0].cost_usd == pytest.approx(10 * 0.075e-6 + 5 * 0.30e-6)
    assert JobStore(str(tmp_path)).all()[0].cost_usd == pytest.approx(
        2 * (10 * 0.075e-6 + 5 * 0.30e-6)
    )


async def test_running_the_same_map_again_reattaches_to_the_job(rlm, batch_server):
    batch_server.batch_jobs.hold.clear()
    prompts = [f"q{i}" for i in range(4)]
    first = asyncio.ensure_future(helpers(rlm).llm_query_batch(prompts, batch_job=True))
    job_id = await job_in_progress(batch_server)
    first.cancel()  # as an interrupt would: the job keeps running at the provider
    with pytest.raises(asyncio.CancelledError):
        await first
    assert batch_server.batch_jobs.states(job_id) == "in_progress"
    batch_server.batch_jobs.hold.set()
    assert await helpers(rlm).llm_query_batch(prompts, batch_job=True) == [
        f"echo: {p}" for p in prompts
    ]
    assert list(batch_server.batch_jobs.batches) == [job_id]  # nothing submitted twice
    # A third run reads the finished job again: its answers are not counted as paid twice.
    before = rlm.client.ledger.cost_usd
    await helpers(rlm).llm_query_batch(prompts, batch_job=True)
    assert rlm.client.ledger.records[-1].cached and rlm.client.ledger.cost_usd == before


@pytest.mark.slow  # a fresh interpreter importing litellm
async def test_a_new_process_reattaches_to_a_job_an_interrupted_one_left(
    rlm, batch_server, tmp_path
):
    batch_server.batch_jobs.hold.clear()
    prompts = ["r0", "r1", "r2"]
    first = asyncio.ensure_future(helpers(rlm).llm_query_batch(prompts, batch_job=True))
    job_id = await job_in_progress(batch_server)
    first.cancel()
    with pytest.raises(asyncio.CancelledError):
        await first
    batch_server.batch_jobs.hold.set()
    script = textwrap.dedent(f"""
        import asyncio, json
        from rlm_magic import RLM
        from rlm_magic.jupyter.helpers import NotebookHelpers
        from rlm_magic.maps.jobs import batch_job
        batch_job.FIRST_POLL_S = 0.02
        rlm = RLM(model="openai/root-model", sub_model="openai/sub-model",
                  api_base={batch_server.base_url!r}, api_key="sk-test", progress=False,
                  cache_dir={str(tmp_path)!r})
        async def main():
            return await NotebookHelpers(rlm).llm_query_batch({prompts!r}, batch_job=True)
        print(json.dumps(asyncio.run(main())))
    """)
    done = await asyncio.to_thread(
        subprocess.run, [sys.executable, "-c", script], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout.splitlines()[-1]) == [f"echo: {p}" for p in prompts]
    assert list(batch_server.batch_jobs.batches) == [job_id]


@pytest.fixture
def sigint_as_in_a_kernel():
    """SIGINT handled as a kernel handles it: it stops the cell, not the process. Here
    the handler in place is asyncio's runner's, which rlm-magic forwards to (as it
    forwards to the kernel's), and which would end the whole test session."""
    previous = signal.signal(signal.SIGINT, lambda signum, frame: None)
    yield
    signal.signal(signal.SIGINT, previous)


async def test_an_interrupt_says_how_to_reattach_or_cancel(
    shell, batch_server, tmp_path, sigint_as_in_a_kernel
):
    session_rlm(shell).cache_dir = str(tmp_path)
    batch_server.batch_jobs.hold.clear()
    code = "await llm_query_batch(['s1', 's2'], batch_job=True)"
    # The cell's error is read from its result: a KeyboardInterrupt raised out of a task
    # would escape the test's event loop.
    cell = asyncio.ensure_future(cell_result(shell, code))
    job_id = await job_in_progress(batch_server)
    await asyncio.to_thread(batch_server.wait_for, lambda: JobStore(str(tmp_path)).all())
    signal.raise_signal(signal.SIGINT)
    error = (await cell).error_in_exec
    assert isinstance(error, KeyboardInterrupt)
    assert str(error) == (
        f"llm_query_batch interrupted; batch job {job_id} keeps running at the provider: "
        f"re-run the cell to reattach, or `%rlm jobs cancel {job_id}` to cancel it"
    )
    assert batch_server.batch_jobs.states(job_id) == "in_progress"


async def test_rlm_jobs_lists_jobs_and_cancels_one(shell, batch_server, tmp_path, capsys):
    session_rlm(shell).cache_dir = str(tmp_path)
    batch_server.batch_jobs.hold.clear()
    rlm = session_rlm(shell)
    cell = asyncio.ensure_future(helpers(rlm).llm_query_batch(["c1", "c2"], batch_job=True))
    job_id = await job_in_progress(batch_server)
    await asyncio.to_thread(batch_server.wait_for, lambda: JobStore(str(tmp_path)).all())
    listing = repr(await run_cell(shell, "%rlm jobs"))
    assert job_id in listing and "0/2" in listing
    await run_cell(shell, f"%rlm jobs cancel {job_id}")
    assert batch_server.batch_jobs.states(job_id) in ("cancelling", "cancelled")
    assert f"Batch job {job_id}: cancelling" in capsys.readouterr().out
    batch_server.batch_jobs.hold.set()
    with pytest.raises(BatchError) as caught:  # the cancelled job's lines never ran
        await cell
    assert "not run: the batch job ended cancelled" in str(caught.value.errors[0])


async def test_a_provider_without_batch_jobs_gets_a_one_line_error(batch_server, tmp_path):
    rlm = make_rlm(batch_server, cache_dir=str(tmp_path), sub_model="anthropic/claude-x")
    with pytest.raises(
        ConfigError,
        match=r"^batch_job: anthropic cannot run batch jobs "
        r"through litellm .*providers that can: openai",
    ):
        await helpers(rlm).llm_query_batch(["a"], batch_job=True)
    assert batch_server.batch_jobs.batches == {}


async def test_a_job_the_provider_has_forgotten_is_submitted_anew(rlm, batch_server):
    await helpers(rlm).llm_query_batch(["f1"], batch_job=True)
    batch_server.batch_jobs.reset(step_s=0.01)  # as a restarted local server would
    assert await helpers(rlm).llm_query_batch(["f1"], batch_job=True) == ["echo: f1"]
    assert len(batch_server.batch_jobs.batches) == 1


@pytest.mark.proxy
async def test_a_batch_job_runs_through_a_real_litellm_proxy(litellm_proxy, batch_server, tmp_path):
    from .support.litellm_proxy import MASTER_KEY

    rlm = make_rlm(
        batch_server,
        model="litellm_proxy/root",
        sub_model="litellm_proxy/sub",
        api_base=litellm_proxy.base_url,
        api_key=MASTER_KEY,
        cache_dir=str(tmp_path),
        timeout=30,
    )
    assert await helpers(rlm).llm_query_batch(["x1", "x2"], batch_job=True) == [
        "echo: x1",
        "echo: x2",
    ]
    assert len(batch_server.batch_jobs.batches) == 1  # the proxy passed the job upstream


async def test_the_progress_line_shows_the_jobs_state_and_counts(
    shell, batch_server, tmp_path, capsys
):
    rlm = session_rlm(shell)
    rlm.cache_dir, rlm.progress = str(tmp_path), True
    batch_server.batch_jobs.hold.clear()
    cell = asyncio.ensure_future(
        run_cell(shell, "await llm_query_batch(['l1', 'l2', 'l3'], batch_job=True)")
    )
    job_id = await job_in_progress(batch_server)
    written = ""
    for _ in range(200):  # the line is rewritten 4 times a second: wait for the state
        written += capsys.readouterr().err
        if f"batch job {job_id} in_progress" in written:
            break
        await asyncio.sleep(0.05)
    assert f"llm_query_batch: 0/3 done | batch job {job_id} in_progress" in written
    batch_server.batch_jobs.hold.set()
    await cell
    last = (written + capsys.readouterr().err).replace("\r", "\n").splitlines()[-1]
    assert last.startswith(f"llm_query_batch: 3/3 done | batch job {job_id} completed")


HALF_DONE = ["fast 1", "slow 1", "fast 2"]


async def cancelled_half_way(rlm, batch_server) -> str:
    """Run HALF_DONE as a job and cancel it once its fast prompts are answered."""
    batch_server.batch_jobs.hold_match = "slow"
    batch_server.batch_jobs.hold.clear()  # the fast lines are answered, the slow one waits
    first = asyncio.ensure_future(helpers(rlm).llm_query_batch(HALF_DONE, batch_job=True))
    job_id = await job_in_progress(batch_server)
    assert await asyncio.to_thread(batch_server.wait_for, lambda: batch_server.completed == 2, 30)
    await asyncio.to_thread(jobs.cancel, rlm.cache_dir, job_id, rlm)
    with pytest.raises(BatchError) as caught:
        await first
    assert caught.value.results == ["echo: fast 1", None, "echo: fast 2"]
    batch_server.batch_jobs.hold.set()
    return job_id


async def test_a_job_cancelled_half_way_is_rerun_only_for_its_missing_prompts(rlm, batch_server):
    job_id = await cancelled_half_way(rlm, batch_server)
    prompts = HALF_DONE
    assert await helpers(rlm).llm_query_batch(prompts, batch_job=True) == [
        f"echo: {p}" for p in prompts
    ]
    # The second job held only the prompt the first left: no answer was paid for twice.
    assert [r["messages"][-1]["content"] for r in batch_server.requests] == [
        "fast 1",
        "fast 2",
        "slow 1",
    ]
    assert sum(not r.cached for r in rlm.client.ledger.records) == 3
    assert len(batch_server.batch_jobs.batches) == 2
    listed = {r.id: r.state for r in JobStore(rlm.cache_dir).all()}
    second = list(batch_server.batch_jobs.batches)[1]
    assert listed == {job_id: "cancelled", second: "completed"}


def test_two_writers_of_one_job_record_at_once_both_succeed_and_leave_it_whole(tmp_path):
    # `%rlm jobs cancel` runs in a thread while the job's poll writes the same record.
    store = JobStore(str(tmp_path))
    records = [jobs.JobRecord("k", f"batch_{n}", "m", "openai", None, 1) for n in range(2)]

    def write_often(record):
        for _ in range(300):
            store.put(record)

    with ThreadPoolExecutor(2) as pool:
        for writer in [pool.submit(write_often, r) for r in records]:
            writer.result()  # raises what the writer raised
    assert store.get("k").id in {"batch_0", "batch_1"}
    assert [p.name for p in (tmp_path / "jobs").iterdir()] == ["k.json"]


def test_cancel_takes_the_whole_id_or_a_prefix_only_one_job_has(tmp_path):
    store = JobStore(str(tmp_path))
    for key, job_id in (("a", "batch_12"), ("b", "batch_1"), ("c", "batch_7")):
        store.put(jobs.JobRecord(key, job_id, "m", "openai", None, 1))
    assert store.find("batch_1").key == "b"  # exact, though batch_12 is older
    assert store.find("batch_7").key == "c" and store.find("batch_12").key == "a"
    assert store.find("batch_9") is None
    with pytest.raises(
        ConfigError,
        match=r"^'batch_' matches 3 batch jobs: batch_12, "
        r"batch_1, batch_7; give the whole id$",
    ):
        store.find("batch_")


def test_cancelling_an_unknown_id_lists_the_known_jobs_and_skips_a_provisional_one(tmp_path):
    # A provisional record (its job's creation was never confirmed) has no id to cancel.
    store = JobStore(str(tmp_path))
    store.put(jobs.JobRecord("a", "batch_1", "m", "openai", None, 1))
    store.put(jobs.JobRecord("b", None, "m", "openai", None, 1))
    with pytest.raises(ConfigError, match=r"^no batch job 'batch_9' recorded \(jobs: batch_1\)$"):
        jobs.cancel(str(tmp_path), "batch_9", RLM())


async def test_a_wait_outlasts_a_few_failed_polls(rlm, batch_server):
    batch_server.batch_jobs.failing_retrieves = 3
    assert await helpers(rlm).llm_query_batch(["w1", "w2"], batch_job=True) == [
        "echo: w1",
        "echo: w2",
    ]
    assert batch_server.batch_jobs.failing_retrieves == 0


async def test_a_provider_out_of_reach_ends_the_wait_with_one_line_naming_the_job(
    rlm, batch_server
):
    batch_server.batch_jobs.failing_retrieves = 1000
    with pytest.raises(LLMQueryError) as caught:
        await helpers(rlm).llm_query_batch(["u1"], batch_job=True)
    [job_id] = batch_server.batch_jobs.batches
    message = str(caught.value)
    assert "\n" not in message and f"checking on batch job {job_id} failed" in message
    assert message.endswith(
        "the job may still be running at the provider: re-run the cell to reattach"
    )
    batch_server.batch_jobs.failing_retrieves = 0
    assert await helpers(rlm).llm_query_batch(["u1"], batch_job=True) == ["echo: u1"]
    assert list(batch_server.batch_jobs.batches) == [job_id]


async def test_a_job_whose_creation_went_unanswered_is_found_not_submitted_again(rlm, batch_server):
    batch_server.batch_jobs.lose_created = True  # the provider made it; the answer was lost
    with pytest.raises(LLMQueryError, match="creating the batch job failed"):
        await helpers(rlm).llm_query_batch(["n1", "n2"], batch_job=True)
    [job_id] = batch_server.batch_jobs.batches
    # Re-run once the job has ended (a user back later): found ended, it is never polled,
    # so its answers are read from what the lookup saw.
    assert await asyncio.to_thread(
        batch_server.wait_for, lambda: batch_server.batch_jobs.states(job_id) == "completed", 30
    )
    assert await helpers(rlm).llm_query_batch(["n1", "n2"], batch_job=True) == [
        "echo: n1",
        "echo: n2",
    ]
    assert list(batch_server.batch_jobs.batches) == [job_id]
    assert [r.id for r in JobStore(rlm.cache_dir).all()] == [job_id]


async def test_a_job_seen_ended_whose_answers_were_never_read_is_read_then_completed(
    rlm, batch_server
):
    batch_server.batch_jobs.hold_match = "slow"
    batch_server.batch_jobs.hold.clear()
    first = asyncio.ensure_future(helpers(rlm).llm_query_batch(HALF_DONE, batch_job=True))
    job_id = await job_in_progress(batch_server)
    assert await asyncio.to_thread(batch_server.wait_for, lambda: batch_server.completed == 2, 30)
    first.cancel()  # interrupted while waiting: the job runs on
    with pytest.raises(asyncio.CancelledError):
        await first
    await asyncio.to_thread(jobs.cancel, rlm.cache_dir, job_id, rlm)
    assert await asyncio.to_thread(
        batch_server.wait_for, lambda: batch_server.batch_jobs.states(job_id) == "cancelled", 30
    )
    # As a poll that saw it end would leave the record, had the run stopped right after.
    store = JobStore(rlm.cache_dir)
    [record] = store.all()
    record.state = "cancelled"
    record.output_file_id = batch_server.batch_jobs.batches[job_id]["output_file_id"]
    store.put(record)
    batch_server.batch_jobs.hold.set()
    assert await helpers(rlm).llm_query_batch(HALF_DONE, batch_job=True) == [
        f"echo: {p}" for p in HALF_DONE
    ]
    assert [r["messages"][-1]["content"] for r in batch_server.requests] == [
        "fast 1",
        "fast 2",
        "slow 1",
    ]
    assert sum(not r.cached for r in rlm.client.ledger.records) == 3


async def test_an_interrupt_during_a_poll_leaves_no_request_unawaited(
    rlm, batch_server, litellm_imported, monkeypatch
):
    # The first poll is held while it asks the provider (in litellm's retrieve_batch, by
    # whatever path it is called), interrupted there, then let go.
    litellm_batches = importlib.import_module("litellm.batches.main")
    retrieve_batch = litellm_batches.retrieve_batch
    asking, answer, answered = threading.Event(), threading.Event(), threading.Event()
    made: list = []  # what each call returned that is still to be awaited

    def held_retrieve_batch(*args, **kwargs):
        if not asking.is_set():
            asking.set()
            answer.wait(30)
        try:
            returned = retrieve_batch(*args, **kwargs)
            if inspect.iscoroutine(returned):
                made.append(returned)
            return returned
        finally:
            answered.set()

    monkeypatch.setattr(litellm_batches, "retrieve_batch", held_retrieve_batch)
    monkeypatch.setattr(litellm_imported, "retrieve_batch", held_retrieve_batch)
    batch_server.batch_jobs.hold.clear()
    first = asyncio.ensure_future(helpers(rlm).llm_query_batch(["i1", "i2"], batch_job=True))
    assert await asyncio.to_thread(asking.wait, 30)
    first.cancel()  # as an interrupt would, while the provider is being asked
    with pytest.raises(asyncio.CancelledError):
        await first
    answer.set()
    assert await asyncio.to_thread(answered.wait, 30)

    def left_unawaited() -> list:
        return [c for c in made if inspect.getcoroutinestate(c) == inspect.CORO_CREATED]

    try:
        # Whatever the poll's request was made of is awaited (or closed), now or soon after.
        deadline = time.monotonic() + 10
        while left_unawaited() and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        assert left_unawaited() == []
    finally:
        for coroutine in left_unawaited():
            coroutine.close()  # (the warning it would give when collected is the failure's)


async def test_a_lost_creation_is_found_by_its_own_file_not_by_an_earlier_job_of_the_map(
    rlm, batch_server
):
    await cancelled_half_way(rlm, batch_server)
    batch_server.batch_jobs.lose_created = True
    with pytest.raises(LLMQueryError, match="creating the batch job failed"):
        await helpers(rlm).llm_query_batch(HALF_DONE, batch_job=True)
    assert await helpers(rlm).llm_query_batch(HALF_DONE, batch_job=True) == [
        f"echo: {p}" for p in HALF_DONE
    ]
    assert len(batch_server.batch_jobs.batches) == 2
    assert sum(not r.cached for r in rlm.client.ledger.records) == 3


async def test_an_interrupt_while_the_job_is_created_says_how_to_reattach(
    shell, batch_server, tmp_path, sigint_as_in_a_kernel
):
    session_rlm(shell).cache_dir = str(tmp_path)
    batch_server.batch_jobs.hold_create.clear()
    code = "await llm_query_batch(['i1', 'i2'], batch_job=True)"
    cell = asyncio.ensure_future(cell_result(shell, code))
    store = JobStore(str(tmp_path))
    assert await asyncio.to_thread(batch_server.wait_for, lambda: store.all(), 30)
    signal.raise_signal(signal.SIGINT)
    error = (await cell).error_in_exec
    [record] = store.all()
    assert isinstance(error, KeyboardInterrupt)
    assert str(error) == (
        f"llm_query_batch interrupted while its batch job was being created (input file "
        f"{record.input_file_id}); the job may be running at the provider: re-run the cell "
        f"to reattach (it is looked up before anything is submitted)"
    )
    batch_server.batch_jobs.hold_create.set()
    # The creation went on, shielded, and its job is recorded: the re-run reattaches.
    assert await helpers(session_rlm(shell)).llm_query_batch(["i1", "i2"], batch_job=True) == [
        "echo: i1",
        "echo: i2",
    ]
    assert len(batch_server.batch_jobs.batches) == 1


async def test_an_interrupt_while_the_ledger_is_told_never_bills_the_job_twice(
    rlm, batch_server, monkeypatch
):
    monkeypatch.setattr(batch_job, "RECORD_SLICE", 1)  # an interrupt can land between records
    ledger = rlm.client.ledger
    task = asyncio.ensure_future(helpers(rlm).llm_query_batch(["b1", "b2", "b3"], batch_job=True))
    record = ledger.record

    def interrupted_after_the_first(call):
        record(call)
        monkeypatch.setattr(ledger, "record", record)
        task.cancel()

    monkeypatch.setattr(ledger, "record", interrupted_after_the_first)
    with pytest.raises(asyncio.CancelledError):
        await task
    assert await helpers(rlm).llm_query_batch(["b1", "b2", "b3"], batch_job=True) == [
        "echo: b1",
        "echo: b2",
        "echo: b3",
    ]
    assert sum(not r.cached for r in ledger.records) == 3
