"""``rlm_magic.unfinished_batch()``: one accessor for the last batch that did not finish,
interrupted or with items that failed or were never sent, item by item; the two names of
earlier versions still answer, with a DeprecationWarning naming it."""

from __future__ import annotations

import asyncio
import signal

import pytest

from rlm_magic import BatchError
from rlm_magic.jupyter import helpers as notebook_helpers
from rlm_magic.jupyter.helpers import unfinished_batch
from rlm_magic.jupyter.unfinished import UnfinishedBatch

from .support import cell_result, helpers, make_rlm, run_cell

PRICED = "openai/gpt-4o"


@pytest.fixture
def sigint_as_in_a_kernel():
    """SIGINT handled as a kernel handles it: it stops the cell, not the process."""
    previous = signal.signal(signal.SIGINT, lambda signum, frame: None)
    yield
    signal.signal(signal.SIGINT, previous)


async def until(condition, what: str) -> None:
    for _ in range(3000):  # up to 30 s: a cold litellm import, a loaded machine
        if condition():
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"never: {what}")


async def test_a_batch_with_failed_items_is_kept_item_by_item(server):
    server.fail("401", match="b")
    rlm = make_rlm(server, max_retries=0)
    with pytest.raises(BatchError) as caught:
        await helpers(rlm).llm_query_batch(["a", "b", "c"])
    batch = unfinished_batch()
    assert batch is caught.value and isinstance(batch, UnfinishedBatch)
    assert not batch.interrupted and batch.helper == "llm_query_batch"
    assert batch.finished == [0, 2] and list(batch.failed) == [1] and batch.not_sent == {}
    assert str(batch).startswith("1 of 3 batch items failed (first: item 1: ")


async def test_items_a_budget_kept_back_are_not_sent_not_failed(server):
    server.usage = None  # counted as billed: ~4 characters a token
    # Room for two calls at their most (a 1,000-character prompt, 1,000 tokens of
    # answer at gpt-4o's prices: ~$0.0125 each), and not three.
    most = (1000 + 16) * 2.5e-6 + 1000 * 1e-5
    rlm = make_rlm(
        server, sub_model=PRICED, max_tokens=1000, max_session_cost_usd=round(most * 2.5, 6)
    )
    prompts = [f"{i:04d} " + "word " * 199 for i in range(6)]
    with pytest.raises(BatchError) as caught:
        await helpers(rlm).llm_query_batch(prompts)
    batch = unfinished_batch()
    assert batch is caught.value
    sent = len(server.requests)
    assert 0 < sent < 6
    assert batch.finished == list(range(sent)) and batch.failed == {}
    assert list(batch.not_sent) == list(range(sent, 6))
    assert all(reason is not None for reason in batch.not_sent.values())  # why each
    message = str(batch)
    assert message.startswith(f"{6 - sent} of 6 batch items were not sent (item {sent}: ")
    assert "failed" not in message.split("(item")[0]


async def test_an_interrupted_map_tells_what_finished_what_was_cancelled_and_what_never_began(
    shell, server, sigint_as_in_a_kernel
):
    server.latency_for = lambda body: 30 if "slow" in body["messages"][-1]["content"] else 0
    shell.user_ns["finished"] = finished = []
    await run_cell(
        shell,
        "async def per_row(row):\n"
        "    answer = await llm_query(row)\n"
        "    finished.append(row)\n"
        "    return answer\n",
    )
    code = "await amap(per_row, ['fast', 'slow', 'later 1', 'later 2'], concurrency=1)"
    cell = asyncio.ensure_future(cell_result(shell, code))
    await until(lambda: finished == ["fast"] and len(server.requests) == 2, "fast done, slow asked")
    signal.raise_signal(signal.SIGINT)
    error = (await cell).error_in_exec
    assert isinstance(error, KeyboardInterrupt)
    assert "rlm_magic.unfinished_batch().results" in str(error)
    batch = unfinished_batch()
    assert batch.interrupted and batch.helper == "amap"
    assert batch.results == ["echo: fast", None, None, None]
    assert batch.finished == [0] and batch.cancelled == [1] and batch.failed == {}
    assert list(batch.not_sent) == [2, 3]  # their function was never called
    assert "1 finished" in repr(batch) and "2 not sent" in repr(batch)


@pytest.mark.parametrize("old_name", ["interrupted_batch", "failed_batch"])
def test_the_old_names_still_answer_and_say_which_name_to_use(old_name):
    old = getattr(notebook_helpers, old_name)
    with pytest.warns(DeprecationWarning, match=r"use rlm_magic\.unfinished_batch\(\)"):
        kept = old()
    assert kept is None or isinstance(kept, UnfinishedBatch)


async def test_the_old_names_give_the_last_of_their_kind(server):
    server.fail("401", match="b")
    rlm = make_rlm(server, max_retries=0)
    with pytest.raises(BatchError) as caught:
        await helpers(rlm).llm_query_batch(["a", "b"])
    with pytest.warns(DeprecationWarning):
        assert notebook_helpers.failed_batch() is caught.value
    with pytest.warns(DeprecationWarning):
        assert notebook_helpers.interrupted_batch() is not caught.value
