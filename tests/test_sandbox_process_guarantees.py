"""The sandboxed REPL: what it guarantees, and that the model cannot tell it apart from
the in-process one. A scripted root model drives real runs over HTTP, as in
test_rlm_loop_and_limits; the model's code runs in a worker process of its own."""

from __future__ import annotations

import asyncio
import os
import pickle
import time
import warnings

import pytest

from rlm_magic.repl import sandbox as sandbox_module
from rlm_magic.repl.sandbox import isolation_report

from .support import eventually, make_rlm, outputs, repl, root_requests

LOST = "every variable you made is lost"


@pytest.fixture
def rlm(server):
    return make_rlm(server, sandbox="process")


def gone(pid: int) -> bool:
    """No such process, or only its exit status is left (a zombie)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except FileNotFoundError:
        return True


def running(marker: str) -> list[int]:
    """Processes on this machine whose command line holds ``marker`` (model code runs
    in a PID namespace of its own: the pids it sees are not the kernel's)."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != os.getpid():
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as cmdline:
                    if marker.encode() in cmdline.read() and not gone(int(entry)):
                        found.append(int(entry))
            except OSError:
                pass
    return found


def workers() -> list[int]:
    """Sandbox processes this test process started that are still alive."""
    return [pid for pid in running("worker.py") if _parent(pid) == os.getpid()]


def _parent(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return int(stat.read().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError):
        return None


# -- a process of its own, for the whole run --------------------------------------------


async def test_model_code_runs_in_a_process_of_its_own_that_keeps_its_namespace(rlm, server):
    server.script(
        "root-model",
        [
            repl("import os\npid = os.getpid()\nx = 41"),
            repl("x += 1\nprint(os.getpid() == pid, x)"),
            "FINAL_VAR(x)",
        ],
    )
    result = await rlm.arun("q", context="c")
    assert result.success and result.final_answer == "42"
    assert outputs(result)[1] == "True 42"
    assert result.sandbox == "process" and result.variables["pid"] != os.getpid()
    if result.isolation["pid"]:
        assert result.variables["pid"] == 1  # pid 1 of a PID namespace of its own
    assert workers() == []  # closed with its run


async def test_the_sandbox_process_ends_with_its_run_however_it_ends(rlm, server):
    server.script("root-model", [repl("import os\nprint(os.getpid())")])
    server.fail("401", times=10, model="root-model", after=1)  # the second turn fails
    ended = await rlm.arun("q", context="c")
    assert not ended.success and outputs(ended)[0]
    assert workers() == []

    server.reset()
    server.script(
        "root-model", [repl("import os, time\nprint(os.getpid(), flush=True)\ntime.sleep(30)")]
    )
    run = rlm.start("q", context="c")
    task = asyncio.ensure_future(run.execute())
    assert await eventually(lambda: getattr(run, "repl", None) and run.repl._step)
    pid = run.repl._sandbox.process.pid
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert gone(pid) and workers() == [] and run.result.stop_reason == "interrupted"


def test_a_sandbox_whose_kernel_dies_ends_with_everything_it_started():
    # A kernel killed without a word (Jupyter's restart, an OOM kill) closes the bridge:
    # the sandbox, pid 1 of its PID namespace, must exit (a SIGKILL to its own
    # process group does not end a namespace's pid 1).
    import subprocess
    import sys
    import uuid

    marker = f"time.sleep(600)  # {uuid.uuid4()}"
    kernel = subprocess.run(
        [
            sys.executable,
            "-c",
            "import asyncio, os\n"
            "from rlm_magic.repl.sandbox import SandboxREPL\n"
            "async def main():\n"
            "    repl = SandboxREPL('c', {})\n"
            "    await repl.start()\n"
            "    await repl.run('import subprocess, sys; subprocess.Popen([sys.executable, "
            f'"-c", "import time; {marker}"])\')\n'
            "    print(repl._sandbox.process.pid, flush=True)\n"
            "    os._exit(0)\n"
            "asyncio.run(main())\n",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    sandbox = int(kernel.stdout.split()[-1])
    deadline = time.monotonic() + 10
    while not gone(sandbox) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert (gone(sandbox), running(marker)) == (True, [])


async def test_processes_the_model_starts_end_with_the_sandbox(rlm, server):
    # The step waits on its sub-call while the test looks (an instant answer could end
    # the run, and the sleep with it, before the test has looked).
    server.model_latency = {"sub-model": 2.0}
    server.script(
        "root-model",
        [
            repl(
                "import subprocess\n"
                "subprocess.Popen(['sleep', '60.101'])\n"
                "print(len(llm_query('started')))"
            ),
            "FINAL(ok)",
        ],
    )
    run = asyncio.ensure_future(rlm.arun("q", context="c"))
    assert await eventually(lambda: server.requests_for("sub-model"))
    assert running("60.101")  # it did start
    await run
    assert await eventually(lambda: not running("60.101"), timeout=5)
    server.model_latency = {}

    # Also when the sandbox crashed first, leaving them behind, and those that left
    # the process group.
    server.script(
        "root-model",
        [
            repl(
                "import os, subprocess\n"
                "subprocess.Popen(['sleep', '60.102'])\n"
                "subprocess.Popen(['setsid', 'sleep', '60.103'])\n"
                "os._exit(1)"
            ),
            "FINAL(ok)",
        ],
    )
    assert (await rlm.arun("q", context="c")).success
    assert await eventually(lambda: not running("60.102") and not running("60.103"), timeout=5)


async def test_child_runs_get_sandboxes_of_their_own(rlm, server):
    def root(body):
        turn = sum(1 for m in body["messages"] if m["role"] == "assistant")
        return repl("import os\nprint(os.getcwd())") if turn == 0 else "FINAL(done)"

    server.reply_with("root-model", root)
    server.reply_with("sub-model", root)
    server.script(
        "root-model",
        [repl("import os\nprint(os.getcwd())\nprint(rlm_query('child?'))"), "FINAL(ok)"],
    )
    result = await rlm.arun("q", context="c")
    root_folder = outputs(result)[0].splitlines()[0]
    child_folder = (
        server.requests_for("sub-model")[-1]["messages"][-1]["content"]
        .split("Output of block 1:\n")[1]
        .splitlines()[0]
    )
    assert result.success and "rlm-sandbox-" in child_folder
    assert len({root_folder, child_folder, os.getcwd()}) == 3


async def test_the_worker_loads_neither_litellm_nor_the_package(rlm, server):
    server.script(
        "root-model",
        [
            repl(
                "import sys\nprint(sorted(m for m in sys.modules if "
                "m.startswith(('litellm', 'rlm_magic', 'IPython', "
                "'traitlets'))))"
            ),
            "FINAL(ok)",
        ],
    )
    result = await rlm.arun("q", context="c")
    assert outputs(result)[0] == str(
        [
            "rlm_magic",
            "rlm_magic.repl",
            "rlm_magic.repl.bridge",
            "rlm_magic.repl.capture",
            "rlm_magic.repl.carried",
            "rlm_magic.repl.finishers",
            "rlm_magic.repl.fitting",
            "rlm_magic.repl.helpers",
            "rlm_magic.repl.isolation",
            "rlm_magic.repl.isolation.confinement",
            "rlm_magic.repl.isolation.filesystem",
            "rlm_magic.repl.isolation.landlock",
            "rlm_magic.repl.isolation.limits",
            "rlm_magic.repl.isolation.linux",
            "rlm_magic.repl.isolation.namespaces",
            "rlm_magic.repl.isolation.network",
            "rlm_magic.repl.isolation.order",
            "rlm_magic.repl.isolation.policy",
            "rlm_magic.repl.isolation.privileges",
            "rlm_magic.repl.isolation.report",
            "rlm_magic.repl.isolation.syscalls",
            "rlm_magic.repl.namespace",
            "rlm_magic.repl.provenance",
            "rlm_magic.repl.rewrite",
            "rlm_magic.repl.steps",
        ]
    )


# -- the model cannot tell the difference ----------------------------------------------


@pytest.mark.parametrize("sandbox", ["process", "none"])
async def test_batches_reach_the_same_peak_concurrency_in_both_repls(server, sandbox):
    rlm = make_rlm(server, sandbox=sandbox, max_concurrency=16)
    server.model_latency = {"sub-model": 0.3}
    server.script(
        "root-model",
        [
            repl("a = llm_query_batch([f'p{i}' for i in range(16)])"),
            repl("b = await asyncio.gather(*[llm_query(f'q{i}') for i in range(16)])"),
            repl("print(len(a), len(b), a[3], b[3])"),
            "FINAL(ok)",
        ],
    )
    result = await rlm.arun("q", context="c")
    assert outputs(result)[2] == "16 16 echo: p3 echo: q3"
    assert server.peak_in_flight == 16


@pytest.mark.parametrize("sandbox", ["process", "none"])
async def test_a_call_the_code_stops_waiting_for_is_cancelled_in_both_repls(server, sandbox):
    rlm = make_rlm(server, sandbox=sandbox)
    server.model_latency = {"sub-model": 5.0}
    server.script(
        "root-model",
        [
            repl(
                "try:\n    await asyncio.wait_for(llm_query('slow'), 0.2)\n"
                "except asyncio.TimeoutError:\n    print('gave up')"
            ),
            repl("import time\ntime.sleep(1)"),  # the run goes on a while after
            "FINAL(ok)",
        ],
    )
    result = await rlm.arun("q", context="c")
    assert outputs(result)[0] == "gave up"
    [call] = rlm.client.ledger.records[1:2]  # after the first root turn
    assert call.model == "openai/sub-model" and call.error == "cancelled"
    assert call.elapsed_s < 0.8  # when the code gave up, not when the run ended


async def test_helper_arguments_json_cannot_carry_arrive_as_in_process(rlm, server):
    server.script(
        "root-model",
        [
            repl(
                "print(llm_query_batch(p for p in ('a', 'b')))\nprint(llm_query_batch({'c'}))\n"
                "class Note:\n    def __str__(self): return 'a note'\nprint(llm_query(Note()))"
            ),
            "FINAL(ok)",
        ],
    )
    result = await rlm.arun("q", context="c")
    assert outputs(result)[0] == "['echo: a', 'echo: b']\n['echo: c']\necho: a note"


async def test_any_text_the_code_prints_crosses_the_bridge(rlm, server):
    server.script(
        "root-model",
        [
            repl("print('caf\u00e9 \u6f22\u5b57', '\\ud800' == '\\ud800')\nprint('\\ud800')"),
            "FINAL(ok)",
        ],
    )
    result = await rlm.arun("q", context="c")
    assert outputs(result)[0].startswith("caf\u00e9 \u6f22\u5b57 True\n")


async def test_a_helper_called_with_wrong_arguments_raises_type_error_in_the_code(rlm, server):
    server.script(
        "root-model",
        [
            repl(
                "try:\n    llm_query()\nexcept TypeError as e:\n"
                "    print('TypeError', 'prompt' in str(e))"
            ),
            "FINAL(ok)",
        ],
    )
    result = await rlm.arun("q", context="c")
    assert outputs(result)[0] == "TypeError True"


async def test_final_var_answer_and_show_vars_work_across_the_bridge(rlm, server):
    server.script(
        "root-model",
        [repl("nums = [1, 2, 3]\nSHOW_VARS()"), "FINAL_VAR(missing)", "FINAL_VAR(nums)"],
    )
    result = await rlm.arun("q", context="c")
    assert outputs(result)[0] == "nums: list"
    assert "no variable named 'missing'" in root_requests(server)[2]["messages"][-1]["content"]
    assert result.final_answer == "[1, 2, 3]"

    server.script("root-model", [repl("answer['content'] = 7\nanswer['ready'] = True")])
    assert (await rlm.arun("q", context="c")).final_answer == "7"


async def test_variables_come_back_as_json_data_or_repr_strings(rlm, server):
    server.script(
        "root-model",
        [
            repl(
                "data = {'a': [1, 2.5, None, 'x']}\nparts = {3, 1}\n"
                "class Thing:\n    def __repr__(self): return 'Thing()'\nthing = Thing()"
            ),
            "FINAL(ok)",
        ],
    )
    result = await rlm.arun("q", context="c")
    assert result.variables["data"] == {"a": [1, 2.5, None, "x"]}
    assert result.variables["parts"] == "{1, 3}" and repr(result.variables["parts"]) == "{1, 3}"
    assert isinstance(result.variables["thing"], sandbox_module.SandboxRepr)
    assert result.to_dict()["variables"] == {
        "data": "dict",
        "parts": "set",
        "Thing": "type",
        "thing": "Thing",
    }


async def test_long_output_is_cut_in_the_sandbox_and_counted(server):
    rlm = make_rlm(server, sandbox="process", max_output_chars=100)
    server.script("root-model", [repl("print('x' * 1_000_000)"), "FINAL(ok)"])
    result = await rlm.arun("q", context="c")
    assert outputs(result)[0] == "x" * 100 + (
        "\n... [output cut: 999,901 more characters not shown; print smaller slices]"
    )


async def test_a_100_mb_context_crosses_once(rlm, server):
    context = "y" * 100_000_000
    server.script(
        "root-model",
        [repl("print(len(context), context[-3:])"), repl("print(len(context))"), "FINAL(ok)"],
    )
    started = time.perf_counter()
    result = await rlm.arun("q", context=context)
    assert outputs(result) == ["100000000 yyy", "100000000"]
    assert time.perf_counter() - started < 10  # the figure is in benchmarks/


async def test_a_context_that_cannot_be_pickled_fails_the_run_in_one_line(rlm, server):
    server.script("root-model", [repl("print(context)"), "FINAL(ok)"])
    result = await rlm.arun("q", context=(i for i in range(3)))
    assert result.stop_reason == "error" and "\n" not in result.error
    assert "cannot be sent to the sandbox" in result.error and "--no-sandbox" in result.error
    assert root_requests(server) == []  # it failed before any model was paid


class Document:  # the worker cannot import this module: like a class made in a notebook
    text = "hi"


async def test_a_context_the_sandbox_cannot_unpickle_fails_the_run_in_one_line(rlm, server):
    server.script("root-model", [repl("print(context)"), "FINAL(ok)"])
    result = await rlm.arun("q", context=Document())
    assert result.stop_reason == "error" and "\n" not in result.error
    assert "could not be unpickled in the sandbox" in result.error
    assert "--no-sandbox" in result.error


# -- the kernel survives whatever the code does ----------------------------------------


@pytest.mark.parametrize(
    "code, reason",
    [
        ("import os\nos._exit(3)", "exited (status 3)"),
        ("import ctypes\nctypes.string_at(0)", "died (SIGSEGV)"),
    ],
)
async def test_a_crash_fails_the_step_and_the_run_goes_on_in_a_fresh_sandbox(
    rlm, server, code, reason
):
    server.script(
        "root-model",
        [repl("x = 1"), repl(code), repl("print('x' in dir(), len(context))"), "FINAL(ok)"],
    )
    result = await rlm.arun("q", context="ctx")
    crashed, after = outputs(result)[1:3]
    assert reason in crashed and LOST in crashed
    assert after == "False 3" and result.success


async def test_a_runaway_loop_is_stopped_by_sigint_and_keeps_the_namespace(server):
    rlm = make_rlm(server, sandbox="process", step_timeout=0.5)
    server.script(
        "root-model", [repl("x = 1\nwhile True:\n    x += 1"), repl("print(x > 1)"), "FINAL(ok)"]
    )
    result = await rlm.arun("q", context="c")
    stopped = result.trajectory[0].code[0]
    assert "ran longer than 0.5s" in stopped.output and LOST not in stopped.output
    assert stopped.elapsed_s < 1.5
    assert outputs(result)[1] == "True"


async def test_a_step_that_ignores_sigint_is_killed_and_the_model_told(server):
    rlm = make_rlm(server, sandbox="process", step_timeout=0.5)
    server.script(
        "root-model",
        [
            repl(
                "import signal\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\nwhile True:\n    pass"
            ),
            repl("print('signal' in dir())"),
            "FINAL(ok)",
        ],
    )
    result = await rlm.arun("q", context="c")
    killed = result.trajectory[0].code[0]
    assert "ran longer than 0.5s" in killed.output and LOST in killed.output
    assert killed.elapsed_s < 0.5 + 1.0
    assert outputs(result)[1] == "False" and result.success


async def test_memory_is_capped_by_an_address_space_limit(server):
    rlm = make_rlm(server, sandbox="process", sandbox_memory_mb=512)
    server.script(
        "root-model",
        [
            repl("kept = 'yes'\nhuge = bytearray(2 * 2**30)"),
            repl("chunks = []\nwhile True:\n    chunks.append(bytearray(50 * 2**20))"),
            repl("del chunks\nprint(kept)"),
            "FINAL(ok)",
        ],
    )
    result = await rlm.arun("q", context="c")
    first, second, third = outputs(result)
    assert first.endswith("MemoryError") and second.endswith("MemoryError")
    assert third == "yes"


# -- what the sandbox does not hold -----------------------------------------------------


async def test_the_environment_is_an_allow_list(rlm, server, monkeypatch):
    monkeypatch.setenv("MY_SERVICE_TOKEN", "tok-very-secret-123")
    monkeypatch.setenv("DATABASE_URL", "postgres://app:pw-fake@db")  # no secret-looking name
    monkeypatch.setenv("SENTRY_DSN", "https://fake-key@sentry.example/1")
    monkeypatch.setenv("PLAIN_SETTING", "visible")
    monkeypatch.setenv("DB_URL", "postgres://me:sk-configured-key-456@db")
    monkeypatch.setenv("LANG", "C.UTF-8")
    rlm.api_key = "sk-configured-key-456"
    rlm.sandbox_env = ["PLAIN_SETTING", "DB_URL"]  # asked for; DB_URL still holds the key
    server.script("root-model", [repl("import os\nprint(sorted(os.environ))"), "FINAL(ok)"])
    result = await rlm.arun("q", context="c")
    seen = set(eval(outputs(result)[0]))
    assert "LANG" in seen
    assert seen - set(sandbox_module.ENVIRONMENT_ALLOWED) == {
        "HOME",
        "PATH",
        "PLAIN_SETTING",
        "TMPDIR",
    }


async def test_the_working_directory_is_a_fresh_folder_removed_afterwards(rlm, server):
    server.script(
        "root-model",
        [
            repl(
                "import os\nopen('notes.txt', 'w').write('hi')\n"
                "print(os.getcwd(), sorted(os.listdir()), os.environ['HOME'] == os.getcwd())"
            ),
            "FINAL(ok)",
        ],
    )
    result = await rlm.arun("q", context="c")
    folder, listing, home = outputs(result)[0].rsplit(" ", 2)
    assert os.path.basename(folder).startswith("rlm-sandbox-")
    assert listing == "['notes.txt']" and home == "True"
    assert folder != os.getcwd() and not os.path.exists(folder)


async def test_the_sandbox_has_no_network(rlm, server):
    host, port = server.base_url.split("//")[1].split("/")[0].split(":")
    server.script(
        "root-model",
        [
            repl(
                "import socket\ntry:\n"
                f"    socket.create_connection(('{host}', {port}), timeout=2)\n"
                "    print('connected')\nexcept OSError as e:\n    print(type(e).__name__)"
            ),
            "FINAL(ok)",
        ],
    )
    result = await rlm.arun("q", context="c")
    if not result.isolation["network"]:
        pytest.skip(f"no network isolation here: {result.isolation['notes']}")
    assert outputs(result)[0] in ("PermissionError", "ConnectionRefusedError", "OSError")
    assert result.network_isolated is True and result.to_dict()["network_isolated"] is True


async def test_without_isolation_the_result_says_so_and_a_warning_says_it_once(
    rlm, server, monkeypatch
):
    monkeypatch.setattr(sandbox_module.SandboxREPL, "isolate", False)
    monkeypatch.setattr(isolation_report, "_warned_isolation", False)
    server.script("root-model", [repl("x = 1"), "FINAL(a)", repl("x = 2"), "FINAL(b)"])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        first = await rlm.arun("q", context="c")
        second = await rlm.arun("q", context="c")
    assert first.network_isolated is False and second.network_isolated is False
    assert not any(
        first.isolation[layer] for layer in ("user", "pid", "filesystem", "network", "syscalls")
    )
    assert first.isolation["notes"]["user"] == "isolation was turned off"
    [warning] = [w for w in caught if "runs without" in str(w.message)]
    assert "\n" not in str(warning.message) and "To fix:" in str(warning.message)


async def test_a_run_that_requires_full_isolation_refuses_to_start_without_it(server, monkeypatch):
    monkeypatch.setattr(sandbox_module.SandboxREPL, "isolate", False)
    rlm = make_rlm(server, sandbox="process", sandbox_require_isolation=True)
    server.script("root-model", [repl("print('ran')"), "FINAL(a)"])
    result = await rlm.arun("q", context="c")
    assert result.stop_reason == "error" and "not fully isolated" in result.error
    assert "\n" not in result.error and "ran" not in str(outputs(result))


# -- the bridge is a trust boundary ------------------------------------------------------


def _send_raw(data: str) -> str:
    """Model code that writes raw bytes to its end of the bridge."""
    return f"import os, sys, struct, time\nos.write(int(sys.argv[1]), {data})\ntime.sleep(5)"


def _json_frame(body: bytes) -> str:
    return f"struct.pack('>cQ', b'J', {len(body)}) + {body!r}"


@pytest.mark.parametrize(
    "data, complaint",
    [
        (_json_frame(b"{not json"), "not JSON"),
        ("struct.pack('>cQ', b'J', 2**40)", "over the"),
        (_json_frame(b"[]"), "without an 'op'"),
        (_json_frame(b'{"op": "variables"}'), "unexpected 'variables'"),
        (_json_frame(b'{"op": "call", "id": 1, "name": 5}'), "malformed helper call"),
    ],
)
async def test_a_hostile_message_fails_the_step_and_the_run_goes_on(rlm, server, data, complaint):
    server.script("root-model", [repl(_send_raw(data)), repl("print('again')"), "FINAL(ok)"])
    result = await rlm.arun("q", context="c")
    broken, after = outputs(result)
    assert "broke the bridge protocol" in broken and complaint in broken and LOST in broken
    assert after == "again" and result.success


async def test_a_batch_past_the_sub_call_budget_is_cut_before_the_kernel_expands_it(server):
    rlm = make_rlm(server, sandbox="process", max_sub_calls=5)
    server.script(
        "root-model",
        [
            repl(
                "out = llm_query_batch([str(i) for i in range(40_000)])\n"
                "print(len(out), out[4], out[5][:30], out[-1] == out[5])"
            ),
            "FINAL(ok)",
        ],
    )
    result = await rlm.arun("q", context="c")
    assert outputs(result)[0] == "40000 echo: 4 Error: max_sub_calls=5 reached True"
    assert len(server.requests_for("sub-model")) == 5


async def test_a_batch_too_large_for_one_message_goes_in_parts(server):
    rlm = make_rlm(server, sandbox="process")
    server.script(
        "root-model",
        [
            repl(
                "out = llm_query_batch(['x' * 3_000_000 + str(i) for i in range(4)])\n"
                "print(len(out), [a[-1] for a in out])"
            ),
            "FINAL(ok)",
        ],
    )
    result = await rlm.arun("q", context="c")
    assert outputs(result)[0] == "4 ['0', '1', '2', '3']"  # 12 MB: over one 8 MB frame


async def test_calls_that_would_hold_too_much_in_the_kernel_are_refused_not_queued(server):
    rlm = make_rlm(server, sandbox="process", max_concurrency=1)
    server.model_latency = {"sub-model": 5.0}  # the first call holds the only slot
    server.script(
        "root-model",
        [
            repl(
                "big = 'x' * 7_000_000\n"
                "calls = [asyncio.ensure_future(llm_query(big + str(i))) for i in range(12)]\n"
                "done, waiting = await asyncio.wait(calls, timeout=1.5)\n"
                "for call in waiting:\n    call.cancel()\n"
                "print(len(waiting), {str(c.exception())[:38] for c in done})"
            ),
            "FINAL(ok)",
        ],
    )
    result = await rlm.arun("q", context="c")
    # About 64 MB of them wait; the rest are refused at once.
    waiting, refusals = outputs(result)[0].split(" ", 1)
    assert 8 <= int(waiting) <= 10 and refusals == "{'RuntimeError: the kernel already holds'}"


async def test_the_kernel_never_unpickles_what_the_sandbox_sends(rlm, server, tmp_path):
    marker = tmp_path / "unpickled"

    class Trap:
        def __reduce__(self):
            return (open, (str(marker), "w"))

    data = pickle.dumps(Trap())
    server.script(
        "root-model",
        [repl(_send_raw(f"struct.pack('>cQ', b'P', {len(data)}) + {data!r}")), "FINAL(ok)"],
    )
    result = await rlm.arun("q", context="c")
    assert "unexpected frame kind" in outputs(result)[0]
    assert not marker.exists()
