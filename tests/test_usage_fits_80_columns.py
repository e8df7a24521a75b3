"""``%rlm usage`` in a terminal fits its width (80 columns where it cannot tell): the
nine columns of figures took over 100 and wrapped, each row over two lines."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from rlm_magic._terminal_text import fitted_table, width
from rlm_magic.jupyter.display import UsageView
from rlm_magic.llm.usage import CallRecord, UsageSummary

MODELS = ["openai/rlm-demo-root", "openai/rlm-demo-sub", "anthropic/claude-sonnet-4-5-20250929"]


def _summary(records: list[CallRecord]) -> UsageSummary:
    summary = UsageSummary()
    for record in records:
        summary.add(record)
    return summary


records = st.builds(
    CallRecord,
    model=st.sampled_from(MODELS) | st.text(min_size=1, max_size=90),
    input_tokens=st.integers(0, 10**9),
    output_tokens=st.integers(0, 10**8),
    cost_usd=st.none() | st.floats(0, 10**5),
    retries=st.integers(0, 3),
    error=st.none() | st.sampled_from(["boom", "cancelled"]),
    cached=st.booleans(),
    rate_limited=st.integers(0, 2),
    cached_input_tokens=st.integers(0, 10**6),
    cut_off=st.booleans(),
)


@settings(max_examples=150, deadline=None)
@given(st.lists(records, min_size=1, max_size=6), st.sampled_from([40, 60, 80, 100]))
def test_the_usage_table_fits_the_terminal_and_keeps_every_figure(shown, columns):
    summary = _summary(shown)
    text = repr(UsageView(summary, columns=columns))
    assert all(width(line) <= columns for line in text.splitlines()), text
    for row in summary._rows():
        for cell in row[1:]:
            if len(cell) < columns - 20 and cell != "0":
                assert cell in text, (cell, text)


def test_a_demo_sessions_usage_is_a_table_at_80_columns():
    summary = _summary(
        [CallRecord("openai/rlm-demo-root", 4_000, 300, 0.0008)] * 3
        + [CallRecord("openai/rlm-demo-sub", 900, 20, 0.0002)] * 48
    )
    text = repr(UsageView(summary, columns=80))
    head = text.splitlines()[0].split()
    assert head[:3] == ["model", "calls", "input"]  # still a table, the zero columns out
    assert text.splitlines()[-1] == "none: cache hits, retries, errors, cancelled"
    assert max(map(width, text.splitlines())) <= 80


def test_wider_terminals_keep_the_whole_table():
    summary = _summary([CallRecord("m", 1, 1, 0.1, retries=1)])
    assert fitted_table(summary._columns, summary._rows(), 200) == repr(summary)


def test_the_view_reads_as_the_summary_in_a_notebook():
    summary = _summary([CallRecord("m", 1, 1, 0.1)])
    view = UsageView(summary)
    assert view.cost_usd == summary.cost_usd and view._repr_html_() == summary._repr_html_()
