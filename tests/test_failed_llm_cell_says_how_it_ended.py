"""A ``%%llm`` cell whose call fails does not keep "answering…" above its error: the
figures line it showed while the answer streamed becomes the line saying how it ended."""

from __future__ import annotations

import pytest

from rlm_magic.jupyter import llm_cell

from .support import run_cell


@pytest.fixture
def notebook_shown(shell, monkeypatch):
    """What the cell shows in a notebook (with widgets): each bundle, in order."""
    monkeypatch.setattr(llm_cell, "widgets_available", lambda: True)
    # A terminal shell formats text/plain only; a notebook's formats these too.
    monkeypatch.setattr(
        shell.display_formatter, "active_types", ["text/plain", "text/html", "text/markdown"]
    )
    published: list[dict] = []
    original = shell.display_pub.publish
    shell.display_pub.publish = lambda data, **kw: published.append(data)
    yield published
    shell.display_pub.publish = original


@pytest.mark.parametrize("kind", ["401", "500"])
async def test_a_failed_llm_cell_replaces_answering_by_the_failure_line(
    shell, server, notebook_shown, kind
):
    server.fail(kind, times=10)
    with pytest.raises(Exception):  # noqa: B017 - whichever error the call raises
        await run_cell(shell, "%%llm\nWhat did checkout cost?")
    assert notebook_shown, "the cell showed nothing while it asked"
    last = notebook_shown[-1]
    for mime in ("text/html", "text/markdown"):
        assert "answering…" not in last[mime], mime
        assert "failed: " in last[mime] and "openai/root-model" in last[mime], mime
    assert "injected" in last["text/html"]  # the provider's sentence, on one line


def test_an_interrupted_call_says_interrupted():
    import asyncio

    answer = llm_cell.LLMAnswer("m", "half an ans")
    answer.fail(asyncio.CancelledError())
    assert answer.meta().startswith("m · interrupted · ")
    assert "half an ans" in answer._repr_markdown_()  # what arrived stays
