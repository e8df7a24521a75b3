"""The extension in an IPython shell: loading, configuration, %rlm and %%rlm.

Cells run through ``run_cell_async`` with the shell's input transformers, as in a
kernel; ``run_cell`` re-raises a cell's error so a failing cell fails its test.
"""

from __future__ import annotations

import asyncio
import io
import os
import re
import sys
import time

import pytest
from IPython.core.error import UsageError
from traitlets import TraitError

import rlm_magic
from rlm_magic.jupyter.extension import session_rlm

from .support import helpers, make_rlm, repl, run_cell

# -- loading ---------------------------------------------------------------------------


def test_loading_puts_awaitable_helpers_in_the_namespace(shell):
    import inspect

    for name in (
        "llm_query",
        "llm_query_batch",
        "llm_query_batched",
        "rlm_query",
        "rlm_query_batch",
        "rlm_query_batched",
    ):
        assert inspect.iscoroutinefunction(shell.user_ns[name]), name


def test_loading_twice_is_harmless_and_unload_removes_everything(shell):
    rlm = session_rlm(shell)
    shell.run_line_magic("load_ext", "rlm_magic")
    rlm_magic.load_ipython_extension(shell)
    assert session_rlm(shell) is rlm
    assert shell.input_transformers_cleanup.count(rlm_magic.jupyter.magics.transform_rlm_cell) == 1
    shell.run_line_magic("unload_ext", "rlm_magic")
    try:
        assert "llm_query" not in shell.user_ns
        assert "rlm" not in shell.magics_manager.magics["cell"]
        assert rlm_magic.jupyter.magics.transform_rlm_cell not in shell.input_transformers_cleanup
        assert rlm not in shell.configurables
    finally:
        shell.run_line_magic("load_ext", "rlm_magic")


def test_loading_does_notimport_litellm():
    import subprocess
    import sys

    # CPU time, not wall time: what loading costs, whatever else shares the machine
    # (wall time reached 1.7 s beside three test suites on two cores).
    code = (
        "import sys, time\nfrom IPython.testing.globalipapp import start_ipython\n"
        "shell = start_ipython()\nt = time.process_time()\n"
        "shell.run_line_magic('load_ext', 'rlm_magic')\n"
        "print(time.process_time() - t, 'litellm' in sys.modules)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout.split()
    assert out[1] == "False"
    assert float(out[0]) < 1.0


async def test_await_in_a_cell_runs_a_batch(shell, server):
    answers = await run_cell(shell, "await llm_query_batch(['a', 'b'])")
    assert answers == ["echo: a", "echo: b"]


async def test_forgetting_await_shows_a_hint_and_no_warning(shell, recwarn):
    import gc

    await run_cell(shell, "pending = llm_query('x')")
    coro = shell.user_ns.pop("pending")
    text = shell.display_formatter.format(coro)[0]["text/plain"]
    assert (
        text == "<llm_query(...) was not run: add `await`, as in `result = await llm_query(...)`>"
    )
    del coro
    gc.collect()
    assert not [w for w in recwarn if "never awaited" in str(w.message)]


async def test_usage_is_shown_per_model(shell, server):
    rlm_magic.usage  # noqa: B018 - the module function, not the magic
    before = rlm_magic.usage().calls
    await run_cell(shell, "await llm_query('x')")
    assert rlm_magic.usage().calls == before + 1
    table = shell.run_line_magic("rlm", "usage")
    assert "openai/sub-model" in repr(table) and "cost (USD)" in repr(table)
    assert "<table" in table._repr_html_()


# -- configuration ---------------------------------------------------------------------


def test_config_magic_sets_the_session_rlm(shell):
    shell.run_line_magic("config", "RLM.max_concurrency = 7")
    assert session_rlm(shell).max_concurrency == 7


def test_rlm_config_shows_settings_with_the_key_masked(shell):
    session_rlm(shell).api_key = "sk-abcdefghijklmnop"
    text = repr(shell.run_line_magic("rlm", "config"))
    assert "sk-...mnop" in text and "sk-abcdefghijklmnop" not in text
    assert "RLM.max_concurrency" in text


def test_rlm_config_text_view_separates_every_name_from_its_value(shell):
    settings = session_rlm(shell).settings()
    lines = repr(shell.run_line_magic("rlm", "config")).splitlines()
    assert [line.split("  ", 1)[0] for line in lines] == [f"RLM.{k}" for k in settings]


def test_environment_variables_give_model_defaults(monkeypatch):
    monkeypatch.setenv("RLM_MODEL", "anthropic/claude-x")
    monkeypatch.setenv("RLM_SUB_MODEL", "openai/gpt-mini")
    rlm = rlm_magic.RLM()
    assert (rlm.model, rlm.effective_sub_model) == ("anthropic/claude-x", "openai/gpt-mini")
    monkeypatch.delenv("RLM_SUB_MODEL")
    assert rlm_magic.RLM().effective_sub_model == "anthropic/claude-x"


def test_ipython_config_file_settings_apply():
    from traitlets.config import Config

    config = Config()
    config.RLM.max_retries = 5
    config.RLM.litellm_kwargs = {"temperature": 0}
    rlm = rlm_magic.RLM(config=config)
    assert rlm.max_retries == 5 and rlm.litellm_kwargs == {"temperature": 0}


@pytest.mark.parametrize(
    "name, good, bad, message",
    [
        ("model", "openai/gpt-4o", "  ", "non-empty"),
        ("api_base", "http://localhost:8000/v1", "localhost:8000", "http(s) URL"),
        ("max_concurrency", 1, 0, ">= 1"),
        ("timeout", 0.5, 0, "> 0"),
        ("max_retries", 0, -1, ">= 0"),
        ("retry_backoff", 0.0, -1.0, ">= 0"),
        ("max_tokens", 1, 0, ">= 1"),
        ("litellm_kwargs", {"temperature": 0.2}, {"stream": True}, "may not set stream"),
        ("max_iterations", 1, 0, ">= 1"),
        ("max_depth", 0, -1, ">= 0"),
        ("max_sub_calls", 0, -5, ">= 0"),
        ("max_cost_usd", 0.5, -1.0, ">= 0"),
        ("max_cost_usd", 0.5, float("nan"), ">= 0"),  # a NaN budget could never trip
        ("step_timeout", 1.0, -1.0, "> 0"),
        ("max_output_chars", 10, 0, ">= 1"),
        ("sandbox", "process", "docker", "one of auto, process, wasm, container, none"),
        ("sandbox_memory_mb", 256, 100, ">= 256"),
    ],
)
def test_every_trait_validates(name, good, bad, message):
    rlm = rlm_magic.RLM()
    setattr(rlm, name, good)
    assert getattr(rlm, name) == good
    with pytest.raises(TraitError, match=message.replace("(", r"\(").replace(")", r"\)")):
        setattr(rlm, name, bad)
    assert getattr(rlm, name) == good


def test_plain_traits_take_their_values(tmp_path):
    rlm = rlm_magic.RLM(
        progress=False,
        cache=True,
        cache_dir=str(tmp_path),
        api_key="k",
        sub_model="openai/s",
        system_prompt="Be {context_type}",
    )
    assert (rlm.progress, rlm.cache, rlm.cache_dir, rlm.api_key) == (
        False,
        True,
        str(tmp_path),
        "k",
    )
    assert rlm.effective_sub_model == "openai/s"


# -- %%rlm -----------------------------------------------------------------------------


async def test_rlm_cell_answers_stores_and_displays(shell, server):
    shell.user_ns["logs"] = "timeout at svc-a\ntimeout at svc-a\nok at svc-b"
    server.script("root-model", [repl("n = context.count('timeout')"), "FINAL_VAR(n)"])
    await run_cell(shell, "%%rlm --context logs --out res\nHow many timeouts?")
    result = shell.user_ns["res"]
    assert result.final_answer == "2" and result.success
    first = server.requests_for("root-model")[0]["messages"]
    assert "How many timeouts?" in first[1]["content"]
    assert "(str, length 45)" in first[0]["content"]


async def test_rlm_cell_defaults_to_the_rlm_variable_and_interpolates(shell, server):
    shell.user_ns["topic"] = "latency"
    server.script("root-model", ["FINAL(ok)"])
    await run_cell(shell, "%%rlm\nTell me about {topic} and {{braces}}")
    assert shell.user_ns["_rlm"].query == "Tell me about latency and {braces}"


async def test_no_interpolate_sends_the_query_as_written(shell, server):
    server.script("root-model", ["FINAL(ok)"])
    await run_cell(shell, "%%rlm --no-interpolate\nKeep {this} as is")
    assert shell.user_ns["_rlm"].query == "Keep {this} as is"


async def test_model_options_override_for_one_run(shell, server):
    server.script("other-root", [repl("print(llm_query('x'))"), "FINAL(ok)"])
    await run_cell(
        shell,
        "%%rlm --model openai/other-root --sub-model openai/other-sub "
        "--max-iterations 3 --max-depth 0 -q\nq",
    )
    assert {r["model"] for r in server.requests} == {"other-root", "other-sub"}
    assert session_rlm(shell).model == "openai/root-model"  # the session is unchanged


async def test_max_iterations_option_limits_the_run(shell, server):
    server.script("root-model", [repl("x = 1"), "no answer"])
    with pytest.raises(rlm_magic.RLMRunError, match="max_iterations=1"):
        await run_cell(shell, "%%rlm --max-iterations 1 -q\nq")
    assert shell.user_ns["_rlm"].stop_reason == "max_iterations"


async def test_a_run_does_not_touch_user_variables(shell, server):
    shell.user_ns.update(x=1, context="mine")
    server.script("root-model", [repl("x = 99\ncontext = 'changed'\ndel llm_query"), "FINAL(ok)"])
    await run_cell(shell, "%%rlm -q\nq")
    assert shell.user_ns["x"] == 1 and shell.user_ns["context"] == "mine"
    assert "llm_query" in shell.user_ns


async def test_live_runs_in_the_notebook_namespace_and_restores_helpers(shell, server):
    import inspect

    shell.user_ns["data"] = [1, 2, 3]
    server.script("root-model", [repl("made_by_model = sum(data)"), "FINAL(ok)"])
    await run_cell(shell, "%%rlm --live -q\nq")
    assert shell.user_ns["made_by_model"] == 6
    assert shell.user_ns["_rlm"].variables == {"made_by_model": 6}
    assert inspect.iscoroutinefunction(shell.user_ns["llm_query"])


@pytest.mark.parametrize(
    "option, default, where",
    [
        ("--sandbox", "none", "process"),
        ("--no-sandbox", "process", "none"),
        ("", "none", "none"),
        ("", "process", "process"),
    ],
)
async def test_sandbox_options_choose_where_the_code_runs(shell, server, option, default, where):
    session_rlm(shell).sandbox = default
    server.script("root-model", [repl("import os\npid = os.getpid()"), "FINAL(ok)"])
    await run_cell(shell, f"%%rlm -q {option}\nq")
    result = shell.user_ns["_rlm"]
    assert result.sandbox == where
    assert (result.variables["pid"] == os.getpid()) == (where == "none")


async def test_live_runs_in_process_even_when_sandboxing_is_the_default(shell, server):
    session_rlm(shell).sandbox = "process"
    server.script("root-model", [repl("made_here = 1"), "FINAL(ok)"])
    await run_cell(shell, "%%rlm --live -q\nq")
    assert shell.user_ns["made_here"] == 1 and shell.user_ns["_rlm"].sandbox == "none"


async def test_quiet_suppresses_display(shell, server, capsys):
    server.script("root-model", ["FINAL(shown?)"])
    shown = []
    original = shell.display_pub.publish
    shell.display_pub.publish = lambda data, **kw: shown.append(data)
    try:
        await run_cell(shell, "%%rlm -q\nq")
        assert shown == []
        server.script("root-model", ["FINAL(shown!)"])
        await run_cell(shell, "%%rlm\nq")
        assert "shown!" in shown[-1]["text/plain"]
    finally:
        shell.display_pub.publish = original


async def test_a_failed_run_fails_the_cell_and_keeps_the_partial_result(shell, server):
    session_rlm(shell).max_retries = 0
    server.fail("401", model="root-model")
    with pytest.raises(rlm_magic.RLMRunError, match="injected bad API key") as caught:
        await run_cell(shell, "%%rlm -q -o partial\nq")
    assert caught.value._render_traceback_()[0].startswith(
        "RLMRunError: RLM run failed: the API key from RLM.api_key was refused for "
        "'openai/root-model' (401: injected bad API key)"
    )
    assert shell.user_ns["partial"].success is False


async def test_no_raise_prints_the_failed_runs_error_and_lets_the_cell_succeed(
    shell, server, capsys
):
    # For papermill and schedulers, which stop a notebook at its first failing cell.
    server.script("root-model", [repl("x = 1"), "no answer"])
    await run_cell(shell, "%%rlm --max-iterations 1 --no-raise -q -o partial\nq")
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        "RLMRunError: RLM run ended without an answer: no FINAL answer within "
        "max_iterations=1; final_answer holds the model's last reply; the partial result "
        "is in partial"
    )
    assert shell.user_ns["partial"].stop_reason == "max_iterations"


async def test_no_raise_prints_an_error_quoting_model_text_with_its_controls_visible(
    shell, server, capsys
):
    from .support.hostile_text import FAILING_RUN, HOSTILE, raw_sequences

    server.script("root-model", FAILING_RUN)
    await run_cell(shell, "%%rlm --no-raise -q -o failed\nq")
    printed = capsys.readouterr().err.strip().splitlines()[-1]
    assert printed.startswith("RLMRunError: RLM run failed: the final answer is an error")
    assert raw_sequences(printed) == {} and "Error: ␛]52;c;UFdORUQ=␇" in printed
    assert shell.user_ns["failed"].final_answer == "Error: " + HOSTILE


@pytest.mark.parametrize(
    "cell, message",
    [
        ("%%rlm --bogus\nq", "unrecognized arguments: --bogus"),
        ("%%rlm --max-iterations many\nq", "invalid int value: 'many'"),
        ("%%rlm --max-iterations 0\nq", "--max-iterations must be >= 1"),
        ("%%rlm --max-depth -1\nq", "--max-depth must be >= 0"),
        ("%%rlm --out 1bad\nq", "--out needs a variable name"),
        ("%%rlm --context missing_var\nq", "no variable named 'missing_var'"),
        ("%%rlm\nabout {missing_var}", "no variable named 'missing_var'"),
        ("%%rlm\nunmatched } brace", "literal braces"),
        ("%%rlm\n   \n", "needs a question"),
        ("%%rlm --model ''\nq", "--model needs a model name"),
        ("%%rlm --live --sandbox\nq", "--live runs the model's code in the notebook's namespace"),
    ],
)
async def test_bad_input_is_one_clear_line(shell, server, cell, message):
    with pytest.raises(UsageError) as caught:
        await run_cell(shell, cell)
    assert message in str(caught.value)
    assert "\n" not in str(caught.value).strip()
    assert server.requests == []


def test_rlm_cell_help_is_available(shell):
    doc = shell.magics_manager.magics["cell"]["rlm"].__doc__
    assert "--context" in doc and "--live" in doc and "--out" in doc


@pytest.mark.parametrize(
    "typed, status",
    [
        ("%%rlm --context logs\n", ("incomplete", 0)),
        ("%%rlm --context logs\nWhich service times out most?\n", ("incomplete", 0)),
        ("%%rlm --context logs\nWhich service times out most?\n\n", ("complete", None)),
    ],
)
def test_an_rlm_cell_is_incomplete_until_a_blank_line(shell, typed, status):
    # What terminal IPython and jupyter console ask before running what was typed.
    assert shell.input_transformer_manager.check_complete(typed) == status


def test_help_cells_are_not_rewritten():
    from rlm_magic.jupyter.magics import transform_rlm_cell

    assert transform_rlm_cell(["%%rlm?\n"]) == ["%%rlm?\n"]
    assert transform_rlm_cell(["%%rlmx\n"]) == ["%%rlmx\n"]
    assert transform_rlm_cell(["%%rlm -c x\n", "q\n"])[0].startswith("await ")


async def test_rlm_cell_runs_sub_calls_concurrently_on_the_shells_loop(shell, server):
    server.model_latency = {"sub-model": 0.5}
    server.script(
        "root-model", [repl("a = llm_query_batch([str(i) for i in range(16)])"), "FINAL(ok)"]
    )
    started = time.perf_counter()
    await run_cell(shell, "%%rlm -q\nq")
    assert time.perf_counter() - started < 3
    assert server.peak_in_flight == 16


async def test_unknown_line_subcommand_is_one_line(shell):
    with pytest.raises(UsageError, match="unknown %rlm subcommand 'frobnicate'"):
        shell.run_line_magic("rlm", "frobnicate")


# -- progress without a widget frontend --------------------------------------------------


@pytest.mark.parametrize(
    "client, request_, terminal",
    [
        # execute_request shapes as measured (jupyter console, nbclient) and as JupyterLab's
        # cells send them (metadata.cellId)
        ("jupyter console", {"content": {"allow_stdin": True}, "metadata": {}}, True),
        ("JupyterLab", {"content": {"allow_stdin": True}, "metadata": {"cellId": "c1"}}, False),
        ("nbclient", {"content": {"allow_stdin": False}, "metadata": {}}, False),
    ],
)
def test_terminal_clients_are_told_apart_from_notebooks(client, request_, terminal):
    from rlm_magic.jupyter.progress import from_a_terminal_client

    assert from_a_terminal_client(request_) is terminal, client


async def test_progress_falls_back_to_a_text_line_on_stderr(shell, server, capsys):
    session_rlm(shell).progress = True
    answers = await run_cell(shell, "await llm_query_batch(['a', 'b', 'c'])")
    captured = capsys.readouterr()
    assert answers == ["echo: a", "echo: b", "echo: c"]
    assert "llm_query_batch: 3/3 done" in captured.err.splitlines()[-1]
    # Progress never writes to stdout: the only output is the cell's own value.
    assert "llm_query_batch" not in captured.out
    assert captured.out.rstrip().endswith("['echo: a', 'echo: b', 'echo: c']")


async def test_a_closed_stderr_does_not_break_a_batch(shell, server, monkeypatch):
    # A script whose stderr is gone, or a test capture closed early: progress is
    # decoration, the answers are the work.
    closed = io.StringIO()
    closed.close()
    monkeypatch.setattr(sys, "stderr", closed)
    session_rlm(shell).progress = True
    answers = await run_cell(shell, "await llm_query_batch(['a', 'b'])")
    assert answers == ["echo: a", "echo: b"]


async def test_rlm_runs_show_a_text_status_line_on_stderr(shell, server, capsys):
    session_rlm(shell).progress = True
    server.script("root-model", [repl("llm_query_batch(['a', 'b'])"), "FINAL(ok)"])
    await run_cell(shell, "%%rlm -q\nq")
    last = capsys.readouterr().err.splitlines()[-1]
    # (Fitted to 80 columns: the last line stays on screen, and must not wrap.)
    assert re.search(r"^RLM \S*root-model \| done \| iter(ation)? 2/30 \| 2 sub-calls \|", last)


async def test_an_interrupted_batch_counts_its_unfinished_calls_as_cancelled(shell, server, capsys):
    rlm = session_rlm(shell)
    rlm.progress = True
    server.latency_for = lambda body: 0.0 if "fast" in body["messages"][-1]["content"] else 30
    calls_before = len(rlm.client.ledger)
    task = asyncio.ensure_future(helpers(rlm).llm_query_batch(["fast", "slow 1", "slow 2"]))
    assert await asyncio.to_thread(server.wait_for, lambda: server.in_flight == 2)
    for _ in range(3000):  # streamed: the fast answer's last chunk is read, then counted
        if len(rlm.client.ledger) > calls_before:
            break
        await asyncio.sleep(0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    last = capsys.readouterr().err.splitlines()[-1]
    assert "llm_query_batch: 1/3 done | 2 cancelled" in last
    assert "in flight" not in last


async def test_an_interrupted_run_counts_its_unfinished_sub_calls_as_cancelled(
    shell, server, capsys
):
    session_rlm(shell).progress = True
    server.script("root-model", [repl("llm_query_batch(['a', 'b'])")])
    server.model_latency["sub-model"] = 30
    task = asyncio.ensure_future(run_cell(shell, "%%rlm -q\nq"))
    # Both arrived (not in_flight == 2: an earlier test's slow request may still be
    # in the server's hands, as it was once under three suites at once).
    assert await asyncio.to_thread(
        server.wait_for, lambda: len(server.requests_for("sub-model")) == 2
    )
    task.cancel()
    with pytest.raises((asyncio.CancelledError, KeyboardInterrupt)):
        await task
    last = capsys.readouterr().err.splitlines()[-1]
    assert re.search(r"\| 0 (sub-)?calls, 2 cancelled \|", last) and "in flight" not in last


async def test_no_progress_when_turned_off(shell, server, capsys):
    session_rlm(shell).progress = False
    await run_cell(shell, "await llm_query_batch(['a', 'b'])")
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize(
    ("old", "name", "now"),
    [
        ("rlm_magic.rlm.engine", "RLM", "rlm_magic.rlm.runner"),
        ("rlm_magic.llm.jobs", "BatchJob", "rlm_magic.maps.jobs"),
        ("rlm_magic.llm.batch", "gather_limited", "rlm_magic.maps.gather"),
        ("rlm_magic.llm.resume", "MapStore", "rlm_magic.maps.resume"),
        ("rlm_magic.llm.openai_wire", "route_for", "rlm_magic.llm.transports.wire"),
        ("rlm_magic.llm.transport", "Answer", "rlm_magic.llm.transports.base"),
    ],
)
def test_a_module_path_of_an_earlier_version_still_imports_and_says_where_it_went(old, name, now):
    import importlib
    import sys

    sys.modules.pop(old, None)
    with pytest.warns(DeprecationWarning, match=now.replace(".", r"\.")):
        found = getattr(importlib.import_module(old), name)
    assert found is getattr(importlib.import_module(now), name)


@pytest.mark.parametrize(
    ("module", "name", "now"),
    [
        ("rlm_magic.llm.client", "load_litellm", "rlm_magic.llm.litellm_loader"),
        ("rlm_magic.llm.windows", "forget_learned", "rlm_magic.llm.profiles"),
        ("rlm_magic.llm.ratelimit", "RateLimitWaitExceeded", "rlm_magic.errors"),
        ("rlm_magic.jupyter.display", "result_html", "rlm_magic.rlm.render"),
    ],
)
def test_a_name_that_moved_out_of_a_module_is_still_found_there(module, name, now):
    import importlib

    with pytest.warns(DeprecationWarning, match=now.replace(".", r"\.")):
        found = getattr(importlib.import_module(module), name)
    assert found is not None
    with pytest.raises(AttributeError):
        importlib.import_module(module).no_such_name  # noqa: B018 - the lookup is the test


def test_a_module_imported_by_its_old_path_still_reloads():
    import importlib
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        import rlm_magic.llm.resume  # noqa: F401 - its old path
    module = importlib.import_module("rlm_magic.maps.resume")
    assert module.__spec__.name == "rlm_magic.maps.resume"
    assert importlib.reload(module) is module


def test_rlm_helpers_of_an_earlier_version_are_the_notebook_s(server):
    from rlm_magic.jupyter.helpers import NotebookHelpers

    with pytest.warns(DeprecationWarning, match="NotebookHelpers"):
        assert isinstance(make_rlm(server).helpers, NotebookHelpers)
