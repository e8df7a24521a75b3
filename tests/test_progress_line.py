"""The progress line of a batch (done and failed apart, rate and time left, answers from
disk or the cache) and the text line that shows it in terminals (cut to their width)."""

from __future__ import annotations

import io
import time

import pytest

import rlm_magic
from rlm_magic.jupyter.progress import BatchProgress, TextLine, terminal_columns

from .support import helpers, make_rlm


class _Answer:
    input_tokens = output_tokens = 0
    cost_usd = None

    def __init__(self, cached: bool = False):
        self.cached = cached


def _progress(total: int, elapsed_s: float) -> BatchProgress:
    progress = BatchProgress(total, enabled=False)
    progress.started = time.perf_counter() - elapsed_s  # as if it had run that long
    return progress


def _finish(progress: BatchProgress, answered: int, failed: int = 0, cached: int = 0) -> None:
    for index in range(answered + failed):
        progress.item_started(index)
    for index in range(answered):
        progress.item_finished(index, _Answer(cached=index < cached))
    for index in range(failed):
        progress.item_failed(answered + index, RuntimeError("no"))


def test_done_and_failed_are_counted_apart():
    progress = _progress(10, 1.0)
    _finish(progress, answered=5, failed=2)
    assert progress.line().startswith("llm_query_batch: 5/10 done | 2 failed | ")


def test_the_line_shows_the_rate_and_the_time_left_at_that_rate():
    progress = _progress(100, 10.0)
    _finish(progress, answered=18, failed=2)  # 18 answers in 10 s, 80 left
    assert "| 1.8 items/s, ~44s left |" in progress.line()
    slow = _progress(200, 30.0)
    _finish(slow, answered=10)  # 3 s an item, 190 left: 9.5 minutes
    assert "| 3.0 s/item, ~9:30 left |" in slow.line()


def test_no_rate_before_the_first_item_and_no_time_left_once_stopped():
    progress = _progress(4, 5.0)
    assert "items/s" not in progress.line() and "left" not in progress.line()
    _finish(progress, answered=2)
    assert "| 2.5 s/item, ~5s left |" in progress.line()
    assert "| 2.5 s/item | " in progress.line(stopped=True)  # the average, no time left


def test_answers_from_disk_and_from_the_cache_are_named_and_not_in_the_rate():
    progress = _progress(10, 2.0)
    progress.kept(6)  # a resumed map: six answers from an earlier run
    _finish(progress, answered=4, cached=3)
    line = progress.line()
    assert line.startswith("llm_query_batch: 10/10 done | 6 from disk | 3 from the cache | ")
    assert "2.0 s/item" in line  # the one this run really asked, in 2 s


def test_the_text_line_fits_the_terminal_and_leaves_nothing_behind(monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")
    stream = io.StringIO()  # no terminal: $COLUMNS decides
    progress = _progress(1000, 3.0)
    progress.label = "a map with a long label " * 4
    view = TextLine(stream)
    view.show(progress)
    _finish(progress, answered=500, failed=3)
    view.update(progress)
    view.finish(progress, "short")
    written = stream.getvalue()
    rewrites = written.split("\r")[1:]
    assert all(len(r.rstrip("\n")) <= 79 for r in rewrites), rewrites
    assert rewrites[0].endswith("…")
    # The last, short line covers what the longer one before it left on the row.
    assert rewrites[-1] == "short".ljust(len(rewrites[-2])) + "\n"


@pytest.mark.parametrize("columns, expected", [("132", 132), ("", 80), ("wide", 80)])
def test_a_stream_that_is_no_terminal_is_cut_for_columns_or_80(monkeypatch, columns, expected):
    monkeypatch.setenv("COLUMNS", columns)
    assert terminal_columns(io.StringIO()) == expected


async def test_a_failed_batchs_answers_are_reachable_by_name(server):
    server.fail("401", match="b")
    rlm = make_rlm(server, max_retries=0)
    with pytest.raises(rlm_magic.BatchError) as caught:
        await helpers(rlm).llm_query_batch(["a", "b", "c"])
    assert rlm_magic.failed_batch() is caught.value
    assert rlm_magic.failed_batch().results == ["echo: a", None, "echo: c"]
    assert "the successful results are in rlm_magic.unfinished_batch().results" in str(caught.value)


async def test_a_batch_answered_from_the_cache_says_so(server, tmp_path, capsys):
    rlm = make_rlm(server, cache=True, cache_dir=str(tmp_path))
    await helpers(rlm).llm_query_batch(["a", "b", "c"])
    rlm.progress = True
    await helpers(rlm).llm_query_batch(["a", "b", "d"])
    last = capsys.readouterr().err.splitlines()[-1].split("\r")[-1]
    assert last.startswith("llm_query_batch: 3/3 done | 2 from the cache | ")


async def test_a_resumed_map_says_how_many_answers_came_from_disk(server, tmp_path, capsys):
    from .support.resumable_maps import interrupted_after

    rlm = make_rlm(server, cache_dir=str(tmp_path))
    prompts = ["fast 1", "slow 1", "fast 2", "slow 2", "fast 3"]
    server.latency_for = lambda body: 30 if "slow" in body["messages"][-1]["content"] else 0
    await interrupted_after(rlm, server, prompts, 3, resume=True)
    server.reset()
    again = make_rlm(server, cache_dir=str(tmp_path), progress=True)
    await helpers(again).llm_query_batch(prompts, resume=True)
    last = capsys.readouterr().err.splitlines()[-1].split("\r")[-1]
    assert last.startswith("llm_query_batch: 5/5 done | 3 from disk | ")
