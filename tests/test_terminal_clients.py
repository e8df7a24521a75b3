"""Terminal clients, driven for real through a pseudo-terminal: terminal IPython and
``jupyter console --kernel rlm``, typing as a user types, with the offline demo model.

Both run prompt_toolkit (the default, full-screen-capable prompt), so a cell is run
when IPython judges it complete: a cell magic needs a blank line to end.
"""

from __future__ import annotations

import io
import os
import re
import sys
import threading
import time
from collections.abc import Callable

import pytest

from rlm_magic.demo import split_tokens

from .support import MEASURED
from .support.hostile_text import FAILING_RUN, HOSTILE, HOSTILE_RUN, raw_sequences

pexpect = pytest.importorskip("pexpect")

pytestmark = pytest.mark.kernel

QUESTION = 'Which service has the most "timeout" lines?'
LOGS = 'logs = "service=a msg=timeout\\nservice=b msg=ok\\nservice=a msg=timeout"'
ANSWER = 'Most "timeout" lines by service: a: 2'
_ANSI = re.compile(r"\x1b(?:\[[0-9;?]*[A-Za-z]|\][^\x07]*\x07)")


def _prompt(number: int) -> str:
    """``In [N]:``, whatever colour codes a client puts around the number."""
    color = r"(?:\x1b\[[0-9;]*m)*"
    return rf"In \[{color}{number}{color}\]:"


class Terminal:
    """A program in a pseudo-terminal, typed into line by line."""

    def __init__(self, argv: list[str], env: dict):
        # poll, not select: late in a full run this process holds over 1,024 descriptors.
        self.child = pexpect.spawn(
            argv[0],
            argv[1:],
            env=env,
            encoding="utf-8",
            timeout=60,
            dimensions=(50, 250),
            use_poll=True,
        )
        self.count = 1
        self.child.expect(_prompt(1), timeout=90)

    def type(
        self,
        *lines: str,
        timeout: float = 60,
        seeing: str | None = None,
        then: Callable[[], object] = lambda: None,
    ) -> str:
        """Type lines (Enter after each) and return what the terminal showed until the
        next prompt, without escape sequences. With ``seeing``: once the terminal has
        shown that text (as received), call ``then()`` and go on to the prompt."""
        for line in lines:
            self.child.send(line + "\r")
        seen = ""
        if seeing is not None:
            self.child.expect_exact(seeing, timeout=timeout)
            seen = self.child.before + self.child.after
            then()
        return self.next_prompt(timeout, seen=seen)

    def next_prompt(self, timeout: float = 60, seen: str = "") -> str:
        self.count += 1
        self.child.expect(_prompt(self.count), timeout=timeout)
        return _ANSI.sub("", seen + self.child.before)

    def close(self) -> None:
        self.child.send("exit\r")
        try:
            self.child.expect(pexpect.EOF, timeout=20)
        except pexpect.TIMEOUT:
            # (Seen twice under load, showing a traceback from litellm's aiohttp
            # transport's __del__: what it printed, for whoever sees it next.)
            pytest.fail(f"no exit 20 s after `exit`; it printed:\n{self.child.before[-3000:]}")
        finally:
            self.child.close(force=True)


@pytest.fixture(scope="module")
def terminal_env(tmp_path_factory) -> dict:
    env = {
        **os.environ,
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",
        "TERM": "xterm",
        "IPYTHONDIR": str(tmp_path_factory.mktemp("ipython")),  # no user config
        # prompt_toolkit otherwise waits for a cursor-position answer pexpect never gives
        "PROMPT_TOOLKIT_NO_CPR": "1",
    }
    env.pop("COLUMNS", None)  # the width is the pseudo-terminal's
    env.pop("LINES", None)
    return env


@pytest.fixture(scope="module")
def ipython(terminal_env):
    """Terminal IPython with rlm_magic loaded and the demo model started."""
    terminal = Terminal(
        [sys.executable, "-m", "IPython", "--no-banner", "--colors=nocolor", "--no-autoindent"],
        terminal_env,
    )
    terminal.type("%load_ext rlm_magic")
    terminal.type("%rlm demo")
    terminal.type(LOGS)
    yield terminal
    terminal.close()


@pytest.fixture(scope="module")
def console(terminal_env):
    """``jupyter console --kernel rlm`` (the kernel spec conftest.py installs into a
    temporary prefix on JUPYTER_PATH), with the demo model started."""
    terminal = Terminal([sys.executable, "-m", "jupyter_console", "--kernel", "rlm"], terminal_env)
    terminal.type("%rlm demo")
    terminal.type(LOGS)
    yield terminal
    terminal.close()


def _typed_rlm_cell_answers(terminal: Terminal) -> None:
    # Enter after the %%rlm line must ask for more, not run a cell with no question; a
    # question ending in "?" is not a help request.
    shown = terminal.type("%%rlm --context logs --out res", QUESTION, "", "")
    assert "UsageError" not in shown and "not found" not in shown
    assert ANSWER in shown
    assert ANSWER in terminal.type("res.final_answer")


def test_rlm_cell_can_be_typed_in_terminal_ipython(ipython):
    _typed_rlm_cell_answers(ipython)


def test_rlm_cell_can_be_typed_in_jupyter_console(console):
    _typed_rlm_cell_answers(console)


def _status_versions(shown: str, prefix: str) -> list[str]:
    """Each version of a status line, in order: it is rewritten in place after a \\r."""
    parts = re.split(r"\r(?!\n)", shown)
    return [part.split("\r\n")[0].strip() for part in parts if part.startswith(prefix)]


BATCH = "_ = await llm_query_batch(['Classify the sentiment: good'] * 3)"
RUN = ("%%rlm --context logs -q", QUESTION, "", "")


@pytest.mark.parametrize("client", ["ipython", "console"])
def test_a_batch_shows_a_live_line_that_ends_as_a_summary(client, request):
    shown = request.getfixturevalue(client).type(BATCH)
    versions = _status_versions(shown, "llm_query_batch: ")
    assert len(versions) >= 2, shown  # rewritten while the batch ran
    assert versions[0].startswith("llm_query_batch: 0/3 done | ")
    assert versions[-1].startswith("llm_query_batch: 3/3 done | ")
    assert re.search(r"llm_query_batch: 3/3 done [^\r\n]*\r\n", shown)  # it stays


@pytest.mark.parametrize("client", ["ipython", "console"])
def test_a_run_shows_a_live_line_that_ends_as_a_summary(client, request):
    shown = request.getfixturevalue(client).type(*RUN)
    versions = _status_versions(shown, "RLM openai/rlm-demo-root | ")
    assert len(versions) >= 2, shown
    assert versions[0].startswith("RLM openai/rlm-demo-root | starting | iteration 0/30")
    assert versions[-1].startswith(
        "RLM openai/rlm-demo-root | done | iteration 3/30 | sub-calls 3 done | "
    )


@pytest.mark.parametrize("client", ["ipython", "console"])
def test_status_lines_fit_an_80_column_terminal_and_leave_nothing_behind(client, request):
    # A line wider than the terminal wraps, and "\r" returns only to its last row: each
    # rewrite would leave rows behind. (jupyter console's kernel measures the terminal
    # the console started it on.)
    terminal = request.getfixturevalue(client)
    terminal.child.setwinsize(50, 80)
    try:
        shown = terminal.type(*RUN) + terminal.type(BATCH)
    finally:
        terminal.child.setwinsize(50, 250)
    rows = shown.split("\r\n")
    for prefix in ("RLM openai/rlm-demo-root | ", "llm_query_batch: "):
        holding = [row for row in rows if prefix in row]
        assert len(holding) == 1, holding  # one row, rewritten in place, then kept
        *rewritten, last = [v for v in re.split(r"\r", holding[0]) if v.strip()]
        assert rewritten and all(len(v) <= 79 for v in rewritten), rewritten
        assert last.rstrip() in shown  # the summary: nothing rewrites it, it may wrap
    # The last line says less to fit (a model's provider, words shortened), not wraps.
    assert re.search(r"\| done \| iter(ation)? 3/30 \| (sub-calls )?3 (sub-)?calls", shown)
    assert "llm_query_batch: 3/3 done" in shown


@pytest.mark.parametrize("cell", [(BATCH,), RUN], ids=["batch", "run"])
def test_jupyter_console_prints_no_widget_reprs(console, cell):
    shown = console.type(*cell)
    for widget_repr in ("HBox(", "IntProgress(", "HTML(value="):
        assert widget_repr not in shown


@pytest.mark.parametrize("client", ["ipython", "console"])
def test_ctrl_c_stops_a_batch_with_one_clear_line(client, request, llm_server):
    terminal = request.getfixturevalue(client)
    llm_server.reset()
    llm_server.latency = 30.0
    terminal.type(f'%config RLM.api_base = "{llm_server.base_url}"')
    terminal.type('%config RLM.sub_model = "openai/sub-model"')
    try:
        terminal.child.send("await llm_query_batch(['a', 'b'])\r")
        assert llm_server.wait_for(lambda: llm_server.in_flight == 2, timeout=30)
        # Ctrl-C once the client shows the batch running, as a person would: jupyter_console
        # takes a Ctrl-C before it marks the cell as executing as one at its prompt (it
        # redraws the prompt and interrupts nothing), and a loaded machine can delay that.
        terminal.child.expect("llm_query_batch: 0/2", timeout=30)
        pressed = time.perf_counter()
        terminal.child.sendintr()  # Ctrl-C
        shown = terminal.next_prompt(timeout=15)
        MEASURED[f"Ctrl-C -> next prompt, {client}"] = time.perf_counter() - pressed
        assert "KeyboardInterrupt: llm_query_batch interrupted: the 0 of 2 answers" in shown
        assert "Traceback" not in shown and "helpers.py" not in shown
        assert "llm_query_batch: 0/2 done | 2 cancelled" in shown
        assert llm_server.wait_for(lambda: llm_server.in_flight == 0, timeout=5)
    finally:
        llm_server.reset()
        terminal.type("%rlm demo")  # back to the demo model for the tests that follow


class _HeldTurn:
    """The server's next streamed turn of ``model``, held before its chunk ``index``
    until ``release()`` (or the end of the ``with``).

    A status line shows the last line of the turn streaming in, redrawn on a timer (4
    times a second): unheld, a line of a few chunks is the last one for less than a
    redraw's interval, more so on a loaded machine, and a redraw may never fall in it.
    Held, the line is the turn's last until the test has seen it shown.
    """

    def __init__(self, server, model: str, index: int):
        self.server, self.model, self.index = server, model, index
        self.held = False
        self._released = threading.Event()
        self._chunk_delay = server.chunk_delay

    def __enter__(self) -> _HeldTurn:
        self.server.chunk_delay = self._delay
        return self

    def __exit__(self, *exc_info) -> None:
        self._released.set()
        vars(self.server).pop("chunk_delay", None)

    def release(self) -> None:
        self._released.set()

    def _delay(self, body: dict, index: int) -> float:
        delay = self._chunk_delay(body, index)
        if not self.held and index == self.index and body.get("model") == self.model:
            self.held = True
            # On the server's thread, so its loop waits too: this turn is the only
            # request in flight. The deadline only bounds a failing test.
            self._released.wait(timeout=120)
        return delay


def _first_line_end(text: str) -> int:
    """The index of the streamed chunk that ends ``text``'s first line."""
    return next(i for i, piece in enumerate(split_tokens(text)) if "\n" in piece)


# The streamed turn's first line, as the status line shows it (controls made visible).
STREAMED_SHOWN = "␛[2J␛[42A ␛]52;c;UFdORUQ=␇"


@pytest.mark.parametrize("client", ["ipython", "console"])
def test_model_text_reaches_the_terminal_shown_not_obeyed(client, request, llm_server):
    # A hostile root model: its streamed turn (the status line), its code's printed
    # output as its answer (the result's line), then a run whose error quotes it.
    terminal = request.getfixturevalue(client)
    llm_server.reset()
    llm_server.token_delay = 0.05
    llm_server.script("root-model", HOSTILE_RUN + FAILING_RUN)
    terminal.type(f'%config RLM.api_base = "{llm_server.base_url}"')
    terminal.type('%config RLM.model = "openai/root-model"')
    received = io.StringIO()  # everything the terminal got, escape sequences and all
    terminal.child.logfile_read = received
    held = _HeldTurn(llm_server, "root-model", _first_line_end(HOSTILE_RUN[0]))
    try:
        with held:  # until the status line has shown the streamed line
            answered = terminal.type(
                "%%rlm --context logs --out hostile",
                "What is it?",
                "",
                "",
                seeing=STREAMED_SHOWN,
                then=held.release,
            )
        failed = terminal.type("%%rlm --context logs --out failed", "And now?", "", "")
        terminal.child.logfile_read = None
        value = terminal.type("hostile.final_answer.encode().hex()")
    finally:
        terminal.child.logfile_read = None
        llm_server.reset()
        terminal.type("%rlm demo")  # back to the demo model for the tests that follow
    found = raw_sequences(received.getvalue())
    MEASURED[f"raw escape sequences from model text, {client}"] = sum(found.values())
    assert found == {}
    # It was all shown: the streamed turn on the status line, the answer, the error.
    assert held.held  # the streamed line was shown while the turn was still streaming
    status = _status_versions(answered, "RLM openai/root-model | ")
    assert any(STREAMED_SHOWN in version for version in status), status
    assert "␛]52;c;UFdORUQ=␇ ␛]8;;https://evil.example/␛\\docs" in answered
    assert "RLMRunError: RLM run failed: the final answer is an error message" in failed
    assert "Error: ␛]52;c;UFdORUQ=␇" in failed
    # And the value is the model's text, exactly.
    assert bytes.fromhex(re.findall(r"'([0-9a-f]+)'", value)[-1]).decode() == HOSTILE


@pytest.mark.parametrize("client", ["ipython", "console"])
def test_an_llm_cell_writes_its_answer_and_its_figures(client, request, llm_server):
    terminal = request.getfixturevalue(client)
    llm_server.reset()
    llm_server.token_delay = 0.01
    terminal.type(f'%config RLM.api_base = "{llm_server.base_url}"')
    try:
        shown = terminal.type("%%llm -m openai/sub-model", "Say **hi**: $1 and $2", "", "")
        value = terminal.type("_llm")
    finally:
        llm_server.reset()
        terminal.type("%rlm demo")  # back to the demo model for the tests that follow
    # The text as written (a terminal shows Markdown as text), then the call's figures.
    assert "echo: Say **hi**: $1 and $2\r\n" in shown, shown
    assert re.search(r"openai/sub-model · \d+ \+ \d+ tokens · ", shown), shown
    assert "'echo: Say **hi**: $1 and $2'" in value
