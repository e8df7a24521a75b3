"""``%rlm?`` and ``%rlm help`` name every subcommand the ``%rlm`` dispatcher knows."""

from __future__ import annotations

import pytest

from rlm_magic.jupyter import subcommands

KNOWN = sorted(subcommands._COMMANDS)


def test_the_dispatcher_knows_the_subcommands_a_newcomer_looks_for():
    assert {"keys", "jobs", "eval"} <= set(KNOWN)


@pytest.mark.parametrize("command", KNOWN)
def test_the_magics_help_names_each_subcommand(shell, command):
    shown = shell.find_line_magic("rlm").__doc__
    assert f"%rlm {command}" in shown
    assert f"%rlm {command}" in subcommands.HELP


def test_rlm_question_mark_shows_the_subcommands(shell, capsys):
    pages: list[str] = []
    from IPython.core import page

    original = page.page
    page.page = lambda data, *a, **k: pages.append(str(data))
    try:
        shell.run_line_magic("pinfo", "%rlm")
    finally:
        page.page = original
    shown = "".join(pages) + capsys.readouterr().out
    for command in KNOWN:
        assert f"%rlm {command}" in shown, command
