"""``%%llm`` (one question, its answer rendered as Markdown), ``%rlm keys`` (which
providers have keys set, never a key) and the magics' help."""

from __future__ import annotations

import pytest

from rlm_magic.jupyter.display import PROVIDER_KEYS

from .support import run_cell


@pytest.fixture
def shown(shell):
    """What the cell displays (display_pub's bundles), in order."""
    published: list[dict] = []
    original = shell.display_pub.publish
    shell.display_pub.publish = lambda data, **kw: published.append(data)
    yield published
    shell.display_pub.publish = original


async def test_in_a_terminal_an_llm_cell_streams_its_answer_then_its_figures(shell, server, capsys):
    server.reply_with("root-model", "## Costs\n**checkout** cost $1,200\x1b[2J")
    await run_cell(shell, "%%llm\nWhat did checkout cost?")
    assert shell.user_ns["_llm"] == "## Costs\n**checkout** cost $1,200\x1b[2J"
    out, err = capsys.readouterr()
    assert out == "## Costs\n**checkout** cost $1,200␛[2J\n"  # shown, not obeyed
    assert err.startswith("openai/root-model · ") and " tokens · " in err
    [request] = server.requests
    assert request["model"] == "root-model" and request.get("stream") is True


def test_the_notebook_view_renders_markdown_with_none_of_the_models_html():
    from rlm_magic.jupyter.llm_cell import LLMAnswer

    answer = LLMAnswer(
        "m", "## Costs\n**a** cost $1,200 and saved $5,000 <img src=x onerror=alert(1)>"
    )
    page, markdown = answer._repr_html_(), answer._repr_markdown_()
    assert "<h2>Costs</h2>" in page and "<strong>a</strong>" in page
    assert "<span>$</span>1,200" in page and "mathjax_ignore" in page
    assert "<img" not in page and "<img" not in markdown
    assert "\\$1,200 and saved \\$5,000" in markdown


async def test_an_llm_cell_fills_in_variables_and_takes_a_model_and_an_out_name(
    shell, server, shown
):
    shell.user_ns["topic"] = "timeouts"
    await run_cell(shell, "%%llm -m openai/sub-model -o reply\nExplain {topic}.")
    assert shell.user_ns["reply"] == "echo: Explain timeouts."
    assert server.requests[-1]["model"] == "sub-model"


async def test_an_llm_cell_counts_in_the_session_usage(shell, server, shown):
    from rlm_magic.jupyter.extension import session_rlm

    ledger = session_rlm(shell).client.ledger
    before = len(ledger)
    await run_cell(shell, "%%llm -q\nq")
    assert len(ledger) == before + 1 and shown == []


@pytest.mark.parametrize(
    "cell, message",
    [
        ("%%llm\n   ", "%%llm needs a question in the cell body"),
        ("%%llm -o 1x\nq", "--out needs a variable name"),
        ("%%llm\n{nowhere}", "no variable named 'nowhere'"),
    ],
)
async def test_an_llm_cell_says_what_is_wrong_with_it(shell, server, cell, message):
    from IPython.core.error import UsageError

    with pytest.raises(UsageError, match=message):
        await run_cell(shell, cell)


def test_the_help_of_the_cell_magics_names_them_as_typed(shell):
    for name in ("rlm", "llm"):
        usage = shell.find_cell_magic(name).__doc__
        assert f"%%{name} [" in usage and f"%{name}_cell" not in usage


def test_rlm_keys_says_which_providers_have_keys_and_never_shows_one(shell, monkeypatch):
    for names in PROVIDER_KEYS.values():
        for name in names:
            for variable in name.split("|"):
                monkeypatch.delenv(variable, raising=False)
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-secret-value")
    monkeypatch.setenv("GOOGLE_API_KEY", "AIza-secret-value")  # gemini takes either
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIA-secret-value")  # one of two
    view = shell.run_line_magic("rlm", "keys")
    text, page = repr(view), view._repr_html_()
    assert "secret" not in text + page
    states = {row[0]: row[2] for row in view.rows}
    assert states["anthropic"] == "yes" and states["gemini"] == "yes"
    assert states["bedrock"] == "partly" and states["openai"] == "no"
    assert {row[0]: row[3] for row in view.rows}["openai"] == "RLM.model, RLM.sub_model"


def test_the_providers_key_table_agrees_with_litellm(monkeypatch, litellm_imported):
    litellm = litellm_imported
    for names in PROVIDER_KEYS.values():
        for name in names:
            for variable in name.split("|"):
                monkeypatch.delenv(variable, raising=False)
    for provider, names in PROVIDER_KEYS.items():
        missing = litellm.validate_environment(model=f"{provider}/some-model")["missing_keys"]
        expected = {variable for name in names for variable in name.split("|")}
        assert set(missing) == expected, provider
