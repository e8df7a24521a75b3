"""The line a run or a batch ends on in a terminal stays on screen: it fits the terminal's
width (80 columns unless told) by saying less, keeping its figures (how it ended, counts,
tokens, dollars, time); and a rate is shown only for calls really made and answered."""

from __future__ import annotations

import io
import re
import time
from types import SimpleNamespace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rlm_magic.jupyter.progress import BatchProgress, RunStatus, TextLine
from rlm_magic.llm.usage import CallRecord, UsageLedger, format_cost

MODELS = [
    "openai/gpt-4o",
    "anthropic/claude-3-5-sonnet-20241022",
    "bedrock/anthropic.claude-3-5-sonnet-20241022-v2:0",
    "openrouter/meta-llama/llama-3.1-405b-instruct-with-a-very-long-deployment-name",
]


def ended_in_a_terminal(display, columns: int, monkeypatch, exc_type=None) -> str:
    """The last line ``display`` writes to a terminal ``columns`` wide."""
    monkeypatch.setenv("COLUMNS", str(columns))
    stream = io.StringIO()  # no terminal: $COLUMNS decides
    display._view = TextLine(stream)
    display.__exit__(exc_type, None, None)
    return stream.getvalue().rsplit("\r", 1)[-1].rstrip("\n").rstrip()


def a_run(model: str, iteration: int, calls: int, failed: int, tokens: int, cost: float):
    ledger = UsageLedger()
    ledger.record(
        CallRecord(
            model,
            input_tokens=tokens - tokens // 3,
            output_tokens=tokens // 3,
            cost_usd=cost,
            cached_input_tokens=tokens // 4,
            cache_saved_usd=cost / 3,
        )
    )
    tree = SimpleNamespace(
        ledger=ledger,
        done=calls - failed,
        failed=failed,
        in_flight=3,
        iteration=iteration,
        max_iterations=30,
        phase="running code",
        live_turn=None,
    )
    result = SimpleNamespace(success=True, final_answer="x", trajectory=[], stop_reason=None)
    return SimpleNamespace(tree=tree, model=model, max_iterations=30, result=result)


@settings(max_examples=40, deadline=None)
@given(
    model=st.sampled_from(MODELS),
    iteration=st.integers(1, 30),
    calls=st.integers(0, 999),
    tokens=st.integers(1, 9_999_999),
    cost=st.floats(0.0001, 999.0),
    columns=st.sampled_from([80, 100, 120]),
    interrupted=st.booleans(),
)
def test_a_runs_last_line_fits_and_keeps_its_figures(
    model, iteration, calls, tokens, cost, columns, interrupted
):
    with pytest.MonkeyPatch.context() as monkeypatch:
        run = a_run(model, iteration, calls, calls // 10, tokens, cost)
        status = RunStatus(run, enabled=False)
        status.started = time.perf_counter() - 1234.5
        line = ended_in_a_terminal(
            status, columns, monkeypatch, KeyboardInterrupt if interrupted else None
        )
    assert len(line) < columns, line
    assert ("interrupted" if interrupted else "done") in line
    assert f"{iteration}/30" in line
    assert re.search(rf"\b(sub-calls {calls} done|{calls} sub-calls|{calls} calls)\b", line)
    assert "3 cancelled" in line and (f"{calls // 10} failed" in line or calls < 10)
    assert format_cost(cost) in line
    # Tokens and time go last, and only where nothing else is left to shorten.
    assert columns < 120 or (f"{tokens:,} tok" in line and line.endswith("| 1234.5s"))


def test_a_short_last_line_is_left_whole(monkeypatch):
    run = a_run("openai/gpt-4o", 3, 4, 0, 1200, 0.0021)
    status = RunStatus(run, enabled=False)
    line = ended_in_a_terminal(status, 200, monkeypatch)
    assert line.startswith("RLM openai/gpt-4o | done | iteration 3/30 | sub-calls 4 done")
    assert "(300 cached, saved $0.0007)" in line


@settings(max_examples=40, deadline=None)
@given(
    label=st.sampled_from(["llm_query_batch", "rlm_query_batch", "amap"]),
    total=st.integers(10, 99_999),
    shares=st.tuples(*[st.integers(0, 1000)] * 5),
    tokens=st.integers(0, 99_999_999),
    cost=st.floats(0.0001, 9_999.0),
    interrupted=st.booleans(),
)
def test_a_batchs_last_line_fits_80_columns_and_keeps_its_figures(
    label, total, shares, tokens, cost, interrupted
):
    kept, cached, answered, failed, unsent = (total * s // 5001 for s in shares)
    progress = BatchProgress(total, label, enabled=False)
    progress.started = time.perf_counter() - 4321.0
    progress.kept(kept)
    progress.done += cached + answered
    progress.cached, progress.failed, progress.unsent = cached, failed, unsent
    progress.input_tokens, progress.cost_usd = tokens, cost
    with pytest.MonkeyPatch.context() as monkeypatch:
        line = ended_in_a_terminal(
            progress, 80, monkeypatch, KeyboardInterrupt if interrupted else None
        )
    assert len(line) < 80, line
    # How it ended, the counts that say what became of the items, and the dollars;
    # answers from disk or the cache (among those done), tokens and time may go.
    assert f"{progress.done}/{total} done" in line
    for count, words in [(failed, "failed"), (unsent, "not sent")]:
        if count:
            assert f"| {count} {words}" in line, line
    if tokens:
        assert format_cost(cost) in line
    assert line.endswith(" (interrupted)") == interrupted


def test_items_never_sent_are_not_said_to_have_failed():
    progress = BatchProgress(10, enabled=False)
    progress.not_sent(4, None)
    line = progress.line(stopped=True)
    assert "4 not sent" in line and "failed" not in line


@pytest.mark.parametrize(
    "cached, failed, from_disk, rate_shown",
    [
        (5, 0, 0, False),  # every answer from the cache: no call was made
        (0, 5, 0, False),  # every call failed: none answered
        (2, 3, 5, False),  # from disk, the cache and failures only
        (2, 3, 0, True),  # and one call really answered
    ],
)
def test_a_rate_is_shown_only_for_calls_really_made_and_answered(
    cached, failed, from_disk, rate_shown
):
    progress = BatchProgress(20, enabled=False)
    progress.started = time.perf_counter() - 2.0
    progress.kept(from_disk)
    progress.done += cached + (1 if rate_shown else 0)
    progress.cached, progress.failed = cached, failed
    for stopped in (False, True):
        line = progress.line(stopped=stopped)
        assert (("items/s" in line) or ("s/item" in line)) == rate_shown, line
