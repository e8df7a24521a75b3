"""The quickstart's summary, printed in a terminal, reads as text, not Markdown source
(it printed ``*answered · ... \\$0.0034*``): ``render.markdown_as_text`` turns a result's
Markdown view back into the lines it shows."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from rlm_magic import RLMResult
from rlm_magic.llm.usage import CallRecord, UsageSummary
from rlm_magic.rlm.render import markdown_as_text, status_line


@settings(max_examples=100, deadline=None)
@given(
    st.floats(0, 50, allow_nan=False),
    st.sampled_from(["final", "max_iterations", "error"]),
    # (one line: an error's own lines may begin with "*", which is its text, not emphasis)
    st.text(max_size=60).map(lambda text: " ".join(text.splitlines())),
)
def test_a_results_markdown_reads_as_its_status_line_in_a_terminal(cost, stop, error):
    usage = UsageSummary()
    usage.add(CallRecord("m", 100, 10, cost))
    result = RLMResult(
        "q",
        final_answer="Most timeouts: auth" if stop == "final" else None,
        success=stop == "final",
        stop_reason=stop,
        error=None if stop == "final" else f"it failed {error}",
        usage=usage,
    )
    text = markdown_as_text(result._repr_markdown_())
    assert status_line(result) in text.splitlines()
    assert "\\$" not in text.split("it failed")[0]
    assert not any(line.startswith("*") for line in text.splitlines())


def test_the_stored_quickstart_summary_lines_read_as_text():
    import json
    from pathlib import Path

    notebook = json.loads(
        (Path(__file__).parent.parent / "notebooks" / "01_quickstart.ipynb").read_text()
    )
    shown = [
        "".join(output["data"]["text/markdown"])
        for cell in notebook["cells"]
        for output in cell.get("outputs", [])
        if "text/markdown" in output.get("data", {})
    ]
    assert shown
    for markdown in shown:
        text = markdown_as_text(markdown)
        assert "\\$" not in text and "*answered" not in text
