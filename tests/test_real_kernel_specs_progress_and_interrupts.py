"""Tests against real Jupyter kernels: the "rlm" kernel spec, live widget progress and
interrupts.

The kernels run in their own processes and reach the FakeLLMServer of this pytest
process over 127.0.0.1. Kernel specs are installed into a temporary prefix, never
globally. The measured interrupt times and message counts are printed at the end of the
test run (see ``pytest_terminal_summary`` in conftest.py).
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import pytest

jupyter_client = pytest.importorskip("jupyter_client")
nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

from jupyter_client.manager import AsyncKernelManager  # noqa: E402
from jupyter_core.utils import run_sync  # noqa: E402

from .support import MEASURED  # noqa: E402
from .support.kernels import (  # noqa: E402
    Kernel,
    configure,
    interrupt_and_check,
    interrupt_timed,
    into_the_step_after_its_sub_call,
    kernel_dir,
    ready_kernel,
    run_python,
)
from .support.session_forger import SESSION_FORGER  # noqa: E402

pytestmark = pytest.mark.kernel

ROOT, SUB = "root-model", "sub-model"  # as the server sees them


def _kernelspec_list(prefix: Path) -> dict:
    env = {**os.environ, "JUPYTER_PATH": str(prefix / "share" / "jupyter")}
    done = run_python("-m", "jupyter", "kernelspec", "list", "--json", env=env)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)["kernelspecs"]


def test_installed_spec(kernel_prefix, kernel_specs):
    spec = kernel_specs.get_kernel_spec("rlm")
    assert spec.display_name == "Python 3 (RLM)"
    assert spec.language == "python"
    assert spec.interrupt_mode == "signal"
    assert spec.metadata == {"debugger": True}
    assert spec.argv == [
        sys.executable,
        "-m",
        "rlm_magic.jupyter.kernel",
        "-f",
        "{connection_file}",
    ]
    for logo in ("logo-32x32.png", "logo-64x64.png"):
        assert (Path(spec.resource_dir) / logo).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (
        Path(_kernelspec_list(kernel_prefix)["rlm"]["resource_dir"])
        == kernel_dir(kernel_prefix) / "rlm"
    )


def test_install_list_uninstall(tmp_path):
    prefix = tmp_path / "prefix"
    assert "rlm2" not in _kernelspec_list(prefix)
    done = run_python(
        "-m", "rlm_magic.jupyter.kernelspec", "install", "--prefix", str(prefix), "--name", "rlm2"
    )
    assert done.returncode == 0, done.stderr
    assert "rlm2" in _kernelspec_list(prefix)
    done = run_python(
        "-m", "rlm_magic.jupyter.kernelspec", "uninstall", "--prefix", str(prefix), "--name", "rlm2"
    )
    assert done.returncode == 0, done.stderr
    assert "Removed" in done.stdout
    assert "rlm2" not in _kernelspec_list(prefix)
    done = run_python(
        "-m", "rlm_magic.jupyter.kernelspec", "uninstall", "--prefix", str(prefix), "--name", "rlm2"
    )
    assert done.returncode == 1
    assert done.stderr.startswith("error: no kernel spec 'rlm2'")
    assert len(done.stderr.strip().splitlines()) == 1


@pytest.fixture(scope="module")
def stock_kernel(kernel_specs, kernel_env, llm_server):
    """The venv's own stock "python3" kernel, after %load_ext rlm_magic."""
    assert kernel_specs.get_kernel_spec("python3").argv[0] == sys.executable
    with ready_kernel("python3", kernel_specs, kernel_env, llm_server, load_ext=True) as kernel:
        yield kernel


def test_rlm_kernel_has_helpers_without_load_ext(rlm_kernel, server):
    assert rlm_kernel.value("await llm_query('hello')") == "echo: hello"
    assert rlm_kernel.value("await llm_query_batch(['a', 'b'])") == ["echo: a", "echo: b"]
    assert server.requests_for(SUB) and not server.requests_for(ROOT)
    assert rlm_kernel.value("'rlm' in get_ipython().magics_manager.magics['cell']") is True


def test_rlm_kernel_loads_the_extension_through_the_extension_manager(rlm_kernel, server):
    assert "already loaded" in rlm_kernel.run("%load_ext rlm_magic")
    rlm_kernel.run("%unload_ext rlm_magic")
    assert rlm_kernel.value("'llm_query' in dir()") is False
    rlm_kernel.run("%load_ext rlm_magic")
    configure(rlm_kernel, server)  # a fresh load starts from the default settings
    assert rlm_kernel.value("await llm_query('again')") == "echo: again"


def execute_notebook(cells, kernel_name: str, kernel_specs, kernel_env, tmp_path):
    """Run code cells with nbclient, as papermill and nbconvert do; the executed copy."""
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in cells])
    spec = kernel_specs.get_kernel_spec(kernel_name)
    nb.metadata["kernelspec"] = {
        "name": kernel_name,
        "display_name": spec.display_name,
        "language": "python",
    }
    km = AsyncKernelManager(kernel_name=kernel_name, kernel_spec_manager=kernel_specs)
    client = nbclient.NotebookClient(
        nb, km=km, timeout=90, resources={"metadata": {"path": str(tmp_path)}}
    )
    try:
        client.execute(env=kernel_env)
    finally:  # nbclient leaves a kernel it did not create running
        if km.has_kernel:
            run_sync(km.shutdown_kernel)(now=True)
    return nb


def configure_cell(server) -> str:
    return "\n".join(
        [
            f'%config RLM.api_base = "{server.base_url}"',
            '%config RLM.model = "openai/root-model"',
            '%config RLM.sub_model = "openai/sub-model"',
            '%config RLM.api_key = "sk-test"',
        ]
    )


def test_notebook_runs_in_rlm_kernel(kernel_specs, kernel_env, server, tmp_path):
    server.script(
        ROOT,
        [
            "Let me look.\n```repl\nprint(context.upper())\n```",
            "The context shouts.\nFINAL(it says HELLO WORLD)",
        ],
    )
    cells = [
        "\n".join(
            [
                f'%config RLM.api_base = "{server.base_url}"',
                '%config RLM.model = "openai/root-model"',
                '%config RLM.sub_model = "openai/sub-model"',
                '%config RLM.api_key = "sk-test"',
            ]
        ),
        "answer = await llm_query('ping')\nprint(answer)",
        "await llm_query_batch(['x', 'y', 'z'])",
        "data = 'hello world'",
        "%%rlm -c data --out res\nWhat does {data!r} say?",
        "res.final_answer, res.success, res.iterations",
    ]
    nb = execute_notebook(cells, "rlm", kernel_specs, kernel_env, tmp_path)

    def text(index):
        # stream and results only: progress widgets come as display_data
        return "".join(
            o["text"] if o.output_type == "stream" else o.data["text/plain"]
            for o in nb.cells[index].outputs
            if o.output_type in ("stream", "execute_result")
        )

    assert text(1) == "echo: ping\n"
    assert text(2) == "['echo: x', 'echo: y', 'echo: z']"
    assert text(5) == "('it says HELLO WORLD', True, 2)"
    root_requests = server.requests_for(ROOT)
    assert len(root_requests) == 2
    assert "What does 'hello world' say?" in root_requests[0]["messages"][-1]["content"]
    assert (
        "HELLO WORLD"
        in root_requests[1]["messages"][-2]["content"] + root_requests[1]["messages"][-1]["content"]
    )


def test_saved_text_beside_progress_widgets_shows_how_the_work_ended(
    kernel_specs, kernel_env, server, tmp_path
):
    server.script(ROOT, ["```repl\nprint(llm_query_batch(['a', 'b']))\n```", "FINAL(two)"])
    cells = [
        configure_cell(server),
        "_ = await llm_query_batch(['x', 'y', 'z'])",
        "data = 'abc'",
        "%%rlm -c data\nWhat is it?",
    ]
    nb = execute_notebook(cells, "rlm", kernel_specs, kernel_env, tmp_path)

    def widget_texts(index):  # what GitHub, nbviewer or VS Code without widgets show
        return [
            o.data["text/plain"]
            for o in nb.cells[index].outputs
            if "application/vnd.jupyter.widget-view+json" in o.get("data", {})
        ]

    [batch] = widget_texts(1)
    assert batch.startswith("llm_query_batch: 3/3 done | ") and "in flight" not in batch
    # The answer below the status carries the figures; the status says how it ended.
    assert widget_texts(3) == ["RLM openai/root-model | done"]


# nbval runs every example notebook against its saved outputs (an error output that is
# not saved fails it there); papermill runs the quickstart, the tour of every helper, in
# the rlm kernel. (All of them here too cost 3 minutes of the suite's 8, for nothing the
# two do not already check.)
EXAMPLES = sorted((Path(__file__).parent.parent / "notebooks").glob("01_*.ipynb"))


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_example_notebook_runs_under_papermill_in_the_rlm_kernel(
    path, kernel_specs, kernel_env, tmp_path, monkeypatch
):
    # nbval runs them in the stock python3 kernel they name; here papermill (stricter:
    # any error output fails it, tagged `raises-exception` or not) in the rlm kernel,
    # where their `%load_ext rlm_magic` finds the extension already loaded.
    papermill = pytest.importorskip("papermill")
    nb = nbformat.read(path, as_version=4)
    assert nb.metadata.kernelspec.name == "python3"
    monkeypatch.setenv("IPYTHONDIR", kernel_env["IPYTHONDIR"])  # no user config
    km = AsyncKernelManager(kernel_name="rlm", kernel_spec_manager=kernel_specs)
    try:
        papermill.execute_notebook(
            str(path),
            str(tmp_path / path.name),
            kernel_name="rlm",
            km=km,
            cwd=str(path.parent),
            progress_bar=False,
        )
    finally:  # a kernel manager handed in is the caller's to shut down
        if km.has_kernel:
            run_sync(km.shutdown_kernel)(now=True)


# -- live progress ------------------------------------------------------------------
def test_widget_updates_stream_while_batch_runs(rlm_kernel, server):
    rlm_kernel.run("%config RLM.progress = True\n%config RLM.max_concurrency = 4")
    server.latency = 1.5
    try:
        started = time.perf_counter()
        msg_id = rlm_kernel.submit("_r = await llm_query_batch([f'p{i}' for i in range(8)])")
        reply, replied = rlm_kernel.wait(msg_id, timeout=60)
    finally:
        rlm_kernel.run("%config RLM.max_concurrency = 16")
    assert reply["status"] == "ok"
    assert server.peak_in_flight == 4
    duration = replied - started
    updates = [
        (t, m)
        for t, m in rlm_kernel.messages(msg_id, "comm_msg")
        if m["content"]["data"].get("method") == "update"
    ]
    during = [t for t, _ in updates if t < replied - 0.5]
    # Live: updates kept coming while requests were still running.
    assert len(during) >= 4, f"only {len(during)} updates before the batch ended"
    assert any(t < started + 1.4 for t in during), "no update during the first wave"
    # Throttled: progress ticks at 4 Hz; allow the opening and closing messages.
    limit = 4 * duration + 8
    bar_values = [
        m["content"]["data"]["state"]["value"]
        for _, m in updates
        if "value" in m["content"]["data"]["state"]
        and isinstance(m["content"]["data"]["state"]["value"], int)
    ]
    MEASURED["widget updates"] = len(updates)
    print(
        f"\n[widgets] {len(updates)} comm_msg updates over {duration:.2f}s "
        f"({len(during)} before the end; limit {limit:.0f}); bar values {bar_values}"
    )
    assert len(updates) <= limit, f"{len(updates)} updates in {duration:.2f}s"
    assert bar_values and bar_values[-1] == 8
    assert rlm_kernel.value("_r") == [f"echo: p{i}" for i in range(8)]


def test_status_widget_shows_the_root_turn_before_the_server_finished_it(rlm_kernel, server):
    rlm_kernel.run("%config RLM.progress = True\nlive_ctx = 'some context'")
    server.token_delay = 0.03
    words = " ".join(f"w{i}" for i in range(60))
    server.script(ROOT, [f"Reading the context first. {words}\nFINAL(seen)"])
    msg_id = rlm_kernel.submit("%%rlm -c live_ctx --out res_live\nWhat is in it?")

    def live_text() -> str | None:
        for _, m in rlm_kernel.messages(msg_id, "comm_msg"):
            value = m["content"]["data"].get("state", {}).get("value")
            if isinstance(value, str) and "rlm-live-turn" in value and " w3 " in value:
                return value
        return None

    assert rlm_kernel.pump(lambda: live_text() is not None, timeout=30), (
        "the status widget never showed the streaming turn"
    )
    streams_done_then = server.completed
    shown = live_text()
    reply, _ = rlm_kernel.wait(msg_id, timeout=60)
    assert reply["status"] == "ok"
    assert "Reading the context first." in shown and "FINAL" not in shown
    assert streams_done_then == 0, "the server had finished the turn already"
    assert rlm_kernel.value("res_live.final_answer") == "seen"


# -- interrupts ---------------------------------------------------------------------
def _mixed_batch(kernel: Kernel, server, label: str) -> None:
    """8 prompts: 4 answer at once, 4 take 30 s; interrupt once the fast 4 are counted
    in the kernel (the progress bar shows 4) and the slow 4 are at the server."""
    kernel.run("%config RLM.progress = True")
    server.latency_for = lambda body: 0.0 if "fast" in body["messages"][-1]["content"] else 30.0

    def ready(msg_id):
        shown = [
            m["content"]["data"]["state"].get("value")
            for _, m in kernel.messages(msg_id, "comm_msg")
            if m["content"]["data"].get("method") == "update"
        ]
        return 4 in shown and server.in_flight == 4

    usage = interrupt_and_check(
        kernel,
        server,
        label,
        "await llm_query_batch([f'fast {i}' for i in range(4)] + [f'slow {i}' for i in range(4)])",
        ready,
    )
    # The 4 answered calls keep their tokens; the 4 cut off are counted as cancelled.
    assert usage == {"calls": 8, "input_tokens": 40, "errors": 0, "cancelled": 4}, usage
    # Every slow call was cut at the server. (Not `completed == 4`: on a loaded machine
    # an earlier test's call in this kernel may still finish after the server's reset.)
    assert server.cancelled == 4 and server.completed >= 4


def test_interrupt_batch_in_rlm_kernel(rlm_kernel, server):
    _mixed_batch(rlm_kernel, server, "a: batch, rlm kernel")


def test_interrupt_batch_in_stock_kernel(stock_kernel, server):
    _mixed_batch(stock_kernel, server, "b: batch, stock kernel")


def test_a_session_cell_cannot_be_forged_by_an_earlier_cells_code(rlm_kernel, server):
    server.script(
        ROOT,
        [
            f"```repl\n{SESSION_FORGER}\n```",
            "FINAL(read)",
            '```repl\nFINAL(f"The honest answer is {sum(range(10))}")\n```',
        ],
    )
    rlm_kernel.run("doc, harmless = 'a poisoned document', 'a harmless one'")
    rlm_kernel.run("%%rlm --session poisoned --context doc -q\nRead the document")
    rlm_kernel.run("%%rlm --session poisoned --context harmless -q\nWhat is the sum of 0 to 9?")
    answer = rlm_kernel.value("_rlm.success, _rlm.final_answer")
    rlm_kernel.run("%rlm forget poisoned")
    assert answer == (True, "The honest answer is 45")


def test_interrupt_rlm_blocking_step(rlm_kernel, server):
    # The model's code makes one sub-call (so we can see the step has started), then
    # blocks its thread in time.sleep.
    server.script(
        ROOT,
        [
            "I will wait.\n```repl\nprint(llm_query('step started'))\n"
            "import time\ntime.sleep(30)\n```"
        ],
    )
    rlm_kernel.run("data = 'some context'")

    def ready(msg_id):
        return server.completed >= 2  # the root reply, then the step's sub-call

    def ready_and_sleeping(msg_id):
        if not ready(msg_id):
            return False
        # The step is now between its sub-call and time.sleep(30): give it a moment to
        # enter the sleep (interrupting any earlier must work too).
        time.sleep(0.3)
        return True

    usage = interrupt_and_check(
        rlm_kernel,
        server,
        "c: %%rlm --no-sandbox, blocking step",
        "%%rlm --no-sandbox -c data\nWhat is in the data?",
        ready_and_sleeping,
    )
    assert usage["calls"] == 2 and usage["errors"] == usage["cancelled"] == 0, usage
    assert rlm_kernel.value("_rlm.stop_reason, _rlm.success") == ("interrupted", False)
    assert rlm_kernel.value("len(_rlm.trajectory), _rlm.iterations") == (1, 1)
    assert rlm_kernel.value("str(__import__('sys').last_value)") == (
        "%%rlm interrupted in iteration 1/30; the partial result is in _rlm"
    )


@pytest.mark.parametrize(
    "label, code",
    [
        ("f: %%rlm --sandbox, sleeping step", "time.sleep(30)"),
        (
            "g: %%rlm --sandbox, step ignoring SIGINT",
            "signal.signal(signal.SIGINT, signal.SIG_IGN)\nwhile True:\n    pass",
        ),
    ],
)
def test_interrupt_a_sandboxed_step(rlm_kernel, server, label, code):
    # SIGINT stops a step that takes it (its namespace is kept until the run closes);
    # one that ignores it is killed after the grace period. Either way within 1 s.
    server.script(
        ROOT, [f"```repl\nimport os, signal, time\nprint(llm_query(str(os.getpid())))\n{code}\n```"]
    )
    rlm_kernel.run("data = 'some context'")

    usage = interrupt_and_check(
        rlm_kernel,
        server,
        label,
        "%%rlm --sandbox -c data\nWhat is in the data?",
        into_the_step_after_its_sub_call(server),
    )
    assert usage["calls"] == 2, usage
    assert rlm_kernel.value("_rlm.sandbox, _rlm.stop_reason") == ("process", "interrupted")
    # Model code has a PID namespace of its own (its pid means nothing here): no child
    # of the kernel may be left running.
    assert (
        rlm_kernel.value(
            "import glob, os\n_left = 0\nfor _p in glob.glob('/proc/[0-9]*/stat'):\n"
            "    try:\n        _f = open(_p).read().rsplit(')', 1)[1].split()\n"
            "    except OSError:\n        continue\n"
            "    _left += _f[1] == str(os.getpid()) and _f[0] not in 'ZX'\n_left"
        )
        == 0
    )


def test_interrupt_rlm_step_awaiting_batch(rlm_kernel, server):
    server.script(
        ROOT,
        [
            "Fan out.\n```repl\nanswers = await llm_query_batch("
            "[f'part {i}' for i in range(8)])\nprint(len(answers))\n```"
        ],
    )
    server.model_latency[SUB] = 30.0
    rlm_kernel.run("data = 'some context'")
    usage = interrupt_and_check(
        rlm_kernel,
        server,
        "d: %%rlm, step awaiting a batch",
        "%%rlm -c data --out res_d\nSummarise the data.",
        lambda msg_id: server.in_flight == 8,
    )
    assert usage["calls"] == 9 and usage["input_tokens"] == 10, usage  # root answered
    assert usage["cancelled"] == 8 and usage["errors"] == 0, usage
    assert server.cancelled == 8
    assert rlm_kernel.value("res_d.stop_reason") == "interrupted"


def test_interrupt_stops_a_cell_whose_batch_runs_in_the_background(rlm_kernel, server):
    # The cell awaits something else; the guarded batch is a background task. Both the
    # batch and the cell must stop.
    server.latency = 30.0
    rlm_kernel.run("import asyncio")
    msg_id = rlm_kernel.submit(
        "_bg = asyncio.ensure_future(llm_query_batch(['a', 'b']))\nawait asyncio.sleep(60)"
    )
    assert rlm_kernel.pump(lambda: server.in_flight == 2, timeout=30)
    reply, _ = interrupt_timed(rlm_kernel, msg_id, "e: background batch, cell sleeping")
    assert reply["status"] == "error"
    assert server.wait_for(lambda: server.in_flight == 0, timeout=10)
    assert rlm_kernel.value("_bg.done()") is True
    assert rlm_kernel.value("1 + 1") == 2


def test_interrupt_leaves_another_cells_background_batch_running(rlm_kernel, server):
    server.latency = 30.0
    rlm_kernel.run("import asyncio\n_bg = asyncio.ensure_future(llm_query_batch(['bg 1', 'bg 2']))")
    msg_id = rlm_kernel.submit("await llm_query_batch(['fg 1', 'fg 2'])")
    assert rlm_kernel.pump(lambda: server.in_flight == 4, timeout=30)
    reply, _ = interrupt_timed(
        rlm_kernel, msg_id, "f: batch, another cell's batch in the background"
    )
    assert reply["ename"] == "KeyboardInterrupt"
    assert server.wait_for(lambda: server.in_flight == 2, timeout=10)
    assert rlm_kernel.value("_bg.done()") is False  # the earlier cell's work goes on
    assert server.in_flight == 2
    rlm_kernel.run("_bg.cancel()")
    assert server.wait_for(lambda: server.in_flight == 0, timeout=10)


def test_interrupt_during_a_streamed_root_turn_closes_the_stream(rlm_kernel, server):
    server.token_delay = 0.1
    server.script(ROOT, ["Let me think at length. " + " ".join(f"w{i}" for i in range(300))])
    rlm_kernel.run("data = 'some context'")
    usage = interrupt_and_check(
        rlm_kernel,
        server,
        "g: %%rlm, root turn streaming",
        "%%rlm -c data --out res_f\nThink it over.",
        lambda msg_id: server.chunks_sent >= 6,
    )
    assert server.wait_for(lambda: server.cancelled == 1, timeout=10), "the stream stayed open"
    assert usage["calls"] == 1 and usage["errors"] == 0 and usage["cancelled"] == 1, usage
    assert rlm_kernel.value("res_f.stop_reason") == "interrupted"
    # The message and the partial result agree on the iterations it holds.
    assert rlm_kernel.value("str(__import__('sys').last_value), res_f.iterations") == (
        "%%rlm interrupted in iteration 1/30, before its reply was complete (the partial "
        "result holds 0 iterations); the partial result is in res_f",
        0,
    )
    # The tokens it had received are counted.
    assert rlm_kernel.value("res_f.usage.output_tokens") >= 3


def _outputs(kernel: Kernel, msg_id: str) -> list[dict]:
    """The messages that become a cell's outputs, in order."""
    kinds = ("stream", "display_data", "execute_result", "error", "update_display_data")
    return [m for _, m in kernel.messages(msg_id) if m["msg_type"] in kinds]


def test_a_failed_run_shows_its_error_once_and_no_empty_result(rlm_kernel, server):
    rlm_kernel.run("%config RLM.max_retries = 0")
    server.fail("401", model=ROOT)
    try:
        msg_id = rlm_kernel.submit("%%rlm\nWhat is it?")
        reply, _ = rlm_kernel.wait(msg_id)
    finally:
        rlm_kernel.run("%config RLM.max_retries = 2")
    assert reply["status"] == "error" and reply["ename"] == "RLMRunError"
    outputs = _outputs(rlm_kernel, msg_id)
    [error] = [m for m in outputs if m["msg_type"] == "error"]
    shown = json.dumps([m["content"] for m in outputs if m is not error])
    assert "injected bad API key" not in shown, shown  # only in the error
    assert error["content"]["traceback"] == [
        "RLMRunError: RLM run failed: the API key from RLM.api_key was refused for "
        "'openai/root-model' (401: injected bad API key): set a valid key in OPENAI_API_KEY "
        "or %config RLM.api_key = ...; the partial result is in _rlm"
    ]
    # No result box with "(no answer)" and "Trajectory (0 iterations)": only the status,
    # settled with the figures the result would have carried.
    assert "rlm-result" not in shown and "Trajectory" not in shown
    settled = [m for m in outputs if m["msg_type"] == "update_display_data"]
    assert settled[-1]["content"]["data"]["text/plain"].startswith(
        "RLM openai/root-model | error | iteration "
    )


def test_an_llm_cell_streams_its_markdown_answer_into_the_notebook(rlm_kernel, server):
    server.reply_with(ROOT, "## Costs\n\n" + " ".join(f"**item{i}** $1" for i in range(40)))
    server.token_delay = 0.03
    msg_id = rlm_kernel.submit("%%llm\nWhat did it cost?")
    reply, _ = rlm_kernel.wait(msg_id)
    assert reply["status"] == "ok"
    outputs = _outputs(rlm_kernel, msg_id)
    first, *updates = [m for m in outputs if m["msg_type"] != "stream"]
    assert first["msg_type"] == "display_data" and len(updates) >= 2  # live, then final
    pages = [m["content"]["data"]["text/html"] for m in [first, *updates]]
    assert "<h2>Costs</h2>" in pages[-1] and "<strong>item39</strong>" in pages[-1]
    # While it streamed, the output showed part of the answer, rendered.
    assert any("<strong>item1</strong>" in p and "item39" not in p for p in pages[1:-1])
    assert " tokens · " in pages[-1] and "answering…" in pages[0]
    assert rlm_kernel.value("_llm").endswith("**item39** $1")


def test_interrupting_an_llm_cell_stops_it_at_once(rlm_kernel, server):
    server.latency = 30.0
    msg_id = rlm_kernel.submit("%%llm\nA slow question")
    assert server.wait_for(lambda: server.in_flight == 1, timeout=30)
    reply, _ = interrupt_timed(rlm_kernel, msg_id, "interrupt -> reply, %%llm")
    assert reply["ename"] == "KeyboardInterrupt"
    assert reply["evalue"] == "%%llm interrupted"
    assert server.wait_for(lambda: server.in_flight == 0, timeout=5)
