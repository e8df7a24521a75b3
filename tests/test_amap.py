"""``amap``: any async function of the user's (a pipeline of calls a row) mapped over
items with what ``llm_query_batch`` has (the progress bar, a concurrency limit,
interrupts that keep the finished results, results kept on disk for a re-run), and
pandas Series in and out of the maps."""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path

import pytest

import rlm_magic
from rlm_magic import BatchError, ConfigError
from rlm_magic.jupyter.extension import session_rlm
from rlm_magic.maps.function_map import function_map_key

from .support import cell_result, helpers, make_rlm, run_cell


def asked(server) -> list[str]:
    return [r["messages"][-1]["content"] for r in server.requests]


def two_calls(llm_query):
    """A pipeline of two calls a row: the second asks about the first's answer."""

    async def per_row(row):
        first = await llm_query(f"facts of {row}")
        return await llm_query(f"summary of {first}")

    return per_row


class Gate:
    """A function that counts how many of its calls are under way at once, and lets
    them end only once ``wanted`` have started (so a map that admitted more would
    have started more by then)."""

    def __init__(self, wanted: int):
        self.wanted, self.active, self.peak = wanted, 0, 0
        self.open = asyncio.Event()

    async def __call__(self, item):
        self.active += 1
        self.peak = max(self.peak, self.active)
        if self.active >= self.wanted:
            self.open.set()
        await self.open.wait()
        self.active -= 1
        return item * 2


async def test_amap_runs_a_two_call_pipeline_per_item_and_keeps_the_items_order(rlm, server):
    results = await helpers(rlm).amap(two_calls(helpers(rlm).llm_query), ["a", "b", "c"])
    assert results == [f"echo: summary of echo: facts of {row}" for row in "abc"]
    # The functions' calls count in the usage and costs like any other.
    assert rlm.client.ledger.summary().total.calls == 6


async def test_amap_runs_at_most_max_concurrency_functions_at_once(server):
    rlm = make_rlm(server, max_concurrency=3)
    gate = Gate(3)
    assert await helpers(rlm).amap(gate, range(10)) == [i * 2 for i in range(10)]
    assert gate.peak == 3


async def test_amap_s_concurrency_limits_its_functions_not_their_calls(server):
    rlm = make_rlm(server, max_concurrency=4)
    server.latency = 0.2
    await helpers(rlm).amap(two_calls(helpers(rlm).llm_query), range(8), concurrency=2)
    assert server.peak_in_flight == 2


async def test_functions_waiting_for_the_client_s_slots_hold_none(server):
    # Two functions at once, each asking a batch of three while the client admits two
    # requests at once: had the functions held client slots, none would ever get one.
    rlm = make_rlm(server, max_concurrency=2)
    server.latency = 0.05
    llm_query_batch = helpers(rlm).llm_query_batch

    async def fan_out(row):
        return await llm_query_batch([f"{row} {i}" for i in range(3)])

    results = await asyncio.wait_for(helpers(rlm).amap(fan_out, ["x", "y", "z"]), 30)
    assert results == [[f"echo: {row} {i}" for i in range(3)] for row in "xyz"]
    assert server.peak_in_flight == 2


async def test_a_failed_item_raises_a_batch_error_with_the_other_results(rlm, server):
    async def fragile(row):
        if row == "bad":
            raise ValueError("no facts in this row")
        return await helpers(rlm).llm_query(row)

    with pytest.raises(BatchError) as failed:
        await helpers(rlm).amap(fragile, ["ok", "bad"])
    assert failed.value.results == ["echo: ok", None]
    assert str(failed.value.errors[1]) == "no facts in this row"
    in_place = await helpers(rlm).amap(fragile, ["ok", "bad"], return_exceptions=True)
    assert in_place[0] == "echo: ok" and isinstance(in_place[1], ValueError)


async def test_a_plain_function_is_each_item_s_error_saying_to_use_async_def(rlm):
    with pytest.raises(BatchError, match="map an `async def` function"):
        await helpers(rlm).amap(str.upper, ["a"])


@pytest.mark.parametrize("items", ["abc", 3])
async def test_items_that_are_not_a_list_are_refused(rlm, items):
    with pytest.raises(ConfigError, match="amap maps over a list"):
        await helpers(rlm).amap(Gate(1), items)


# -- interrupts and kept results ---------------------------------------------------------


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


async def test_an_interrupt_keeps_the_finished_results_reachable_by_name(
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
    code = "await amap(per_row, ['fast', 'slow 1', 'slow 2'])"
    cell = asyncio.ensure_future(cell_result(shell, code))
    await until(lambda: finished == ["fast"] and len(server.requests) == 3, "fast done, slow asked")
    signal.raise_signal(signal.SIGINT)
    error = (await cell).error_in_exec
    assert isinstance(error, KeyboardInterrupt)
    assert str(error).startswith("amap interrupted: the 1 of 3 answers that had arrived")
    assert rlm_magic.unfinished_batch().results == ["echo: fast", None, None]
    # Nothing is left running: the slow calls were cancelled with the map (the client
    # closed their connections).
    assert await asyncio.to_thread(server.wait_for, lambda: server.cancelled >= 2, 10)


def kept_lines(cache_dir: Path) -> int:
    maps = cache_dir / "maps"
    return (
        sum(len(p.read_text().splitlines()) for p in maps.glob("*.jsonl")) if maps.is_dir() else 0
    )


async def test_a_rerun_after_an_interrupt_calls_the_function_only_on_the_unfinished_items(
    server, tmp_path
):
    rows = ["fast 1", "slow 1", "fast 2"]
    server.latency_for = lambda body: 30 if "slow" in body["messages"][-1]["content"] else 0
    rlm = make_rlm(server, cache_dir=str(tmp_path))
    per_row = two_calls(helpers(rlm).llm_query)
    task = asyncio.ensure_future(helpers(rlm).amap(per_row, rows, resume=True))
    # Both fast rows kept, and the slow row's first call sent: nothing of this run's
    # reaches the server after the reset below.
    await until(lambda: kept_lines(tmp_path) == 2 and len(server.requests) == 5, "two kept")
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    server.reset()
    # A new RLM, as after a kernel restart: only the disk remembers.
    again = make_rlm(server, cache_dir=str(tmp_path))
    results = await helpers(again).amap(two_calls(helpers(again).llm_query), rows, resume=True)
    assert results == [f"echo: summary of echo: facts of {row}" for row in rows]
    assert asked(server) == ["facts of slow 1", "summary of echo: facts of slow 1"]
    assert kept_lines(tmp_path) == 0  # finished: its file is gone


async def test_results_that_are_not_json_are_not_kept_and_say_so(rlm, server, tmp_path):
    rlm.cache_dir = str(tmp_path)

    async def pair(row):
        if row == "bad":
            raise ValueError("fails, so the map's file stays")
        return (row, await helpers(rlm).llm_query(row))

    with pytest.warns(RuntimeWarning, match="1 of 2 results were not kept on disk"):
        with pytest.raises(BatchError):
            await helpers(rlm).amap(pair, ["ok", "bad"], resume=True)
    assert kept_lines(tmp_path) == 0


async def test_items_a_rerun_could_not_recognise_are_said_so_when_resuming(rlm, tmp_path):
    rlm.cache_dir = str(tmp_path)

    class Ticket:  # its repr names its address: another ticket in the next process
        pass

    with pytest.warns(RuntimeWarning, match=r"cannot resume: item 0 \(a Ticket\)"):
        await helpers(rlm).amap(Gate(1), [Ticket()], resume=True, return_exceptions=True)


TEMPLATE = "Summarise: {row}"


async def summarise(row):
    return TEMPLATE.format(row=row)


def test_a_map_is_known_by_its_function_s_source_the_values_it_reads_and_its_items(
    monkeypatch,
):
    key = function_map_key(summarise, ["a", "b"])
    assert function_map_key(summarise, ["a", "b"]) == key
    assert function_map_key(summarise, ["a", "c"]) != key
    assert function_map_key(summarise, ["a", "b"], settings={"model": "m"}) != key
    # A prompt template edited between an interrupt and the re-run: nothing kept fits.
    monkeypatch.setattr(f"{__name__}.TEMPLATE", "Translate: {row}")
    assert function_map_key(summarise, ["a", "b"]) != key


async def test_a_cell_s_function_is_known_by_its_source_and_the_template_it_reads(shell):
    define = "async def per_row(row):\n    return await llm_query(TEMPLATE.format(row))\n"
    key = "function_map_key(per_row, ['a'])"
    await run_cell(shell, "from rlm_magic.maps.function_map import function_map_key")
    await run_cell(shell, "TEMPLATE = 'Summarise: {}'\n" + define)
    first = await run_cell(shell, key)
    await run_cell(shell, define)  # the same function, defined again in another cell
    assert await run_cell(shell, key) == first
    await run_cell(shell, "TEMPLATE = 'Translate: {}'")
    assert await run_cell(shell, key) != first


# -- the notebook's names ----------------------------------------------------------------


async def test_load_ext_and_rlm_magic_give_the_same_amap_bound_to_the_notebook_s_rlm(shell, server):
    session_rlm(shell).max_concurrency = 2
    shell.user_ns["gate"] = gate = Gate(2)
    assert await run_cell(shell, "await amap(gate, [1, 2, 3])") == [2, 4, 6]
    assert gate.peak == 2
    shell.user_ns["gate"] = gate = Gate(2)
    code = "import rlm_magic\nawait rlm_magic.amap(gate, [1, 2, 3])"
    assert await run_cell(shell, code) == [2, 4, 6]
    assert gate.peak == 2


async def test_forgetting_await_on_amap_shows_the_hint(shell):
    await run_cell(shell, "pending = amap(str, [1])")
    coro = shell.user_ns.pop("pending")
    text = shell.display_formatter.format(coro)[0]["text/plain"]
    assert text == "<amap(...) was not run: add `await`, as in `result = await amap(...)`>"


# -- pandas ------------------------------------------------------------------------------


async def test_a_series_of_prompts_gives_a_series_of_answers_on_its_index(rlm, server):
    pd = pytest.importorskip("pandas")
    prompts = pd.Series(["a", "b"], index=["r7", "r3"], name="review")
    answers = await helpers(rlm).llm_query_batch(prompts)
    assert isinstance(answers, pd.Series)
    assert list(answers.index) == ["r7", "r3"] and answers.name == "review"
    assert answers.tolist() == ["echo: a", "echo: b"]


async def test_amap_over_a_series_gives_a_series_on_its_index(rlm, server):
    pd = pytest.importorskip("pandas")
    reviews = pd.Series(["a", "b", "c"], index=[10, 20, 30])
    summaries = await helpers(rlm).amap(two_calls(helpers(rlm).llm_query), reviews)
    assert list(summaries.index) == [10, 20, 30]
    assert summaries[20] == "echo: summary of echo: facts of b"


async def test_amap_over_a_dataframe_calls_the_function_on_each_row(rlm, server):
    pd = pytest.importorskip("pandas")
    frame = pd.DataFrame({"title": ["t1", "t2"], "body": ["b1", "b2"]}, index=["x", "y"])

    async def per_row(row):
        return await helpers(rlm).llm_query(f"{row['title']}: {row['body']}")

    labels = await helpers(rlm).amap(per_row, frame)
    assert labels.to_dict() == {"x": "echo: t1: b1", "y": "echo: t2: b2"}


async def test_a_dataframe_of_prompts_is_refused_before_anything_is_sent(rlm, server):
    pd = pytest.importorskip("pandas")
    with pytest.raises(ConfigError, match=r"got a DataFrame: pass one column of prompts"):
        await helpers(rlm).llm_query_batch(pd.DataFrame({"prompt": ["a"]}))
    assert server.requests == []
