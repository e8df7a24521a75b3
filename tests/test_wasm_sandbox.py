"""The wasm sandbox (``RLM.sandbox = "wasm"``): model code runs in Pyodide inside a Deno
process started without network, environment, subprocess or read permissions, its
bridge over stdin and stdout. It keeps the process sandbox's promises
(test_sandbox_process_guarantees, test_sandbox_attacks, test_sandbox_bounds): steps keep
their namespace, helpers are served on the kernel's loop, attacks on the host's files,
network, environment and processes fail, steps stop at their timeout, memory is capped,
the bridge is a trust boundary, sessions carry variables, and no process outlives it.

One sandbox serves most tests (each start costs Pyodide's load, seconds); tests that
break it come last, and the next step starts a fresh one as it would in a run. What the
kernel reads of Deno's process from outside (its environment, its memory, what is left
running) is read from /proc, on Linux.

Why one module: every test here drives the same backend through the same shared
sandbox, whose start is the cost worth sharing.
"""

from __future__ import annotations

import asyncio
import json
import os
import pickle
import re
import socket
import struct
import subprocess
import sys
import threading
import time

import pytest
import pytest_asyncio

from rlm_magic.errors import SandboxError
from rlm_magic.repl.backends import wasm
from rlm_magic.repl.base import SandboxSettings
from rlm_magic.repl.carried import SessionStart
from rlm_magic.repl.sandbox.repl import SandboxREPL

from .support import eventually

pytestmark = [
    pytest.mark.skipif(wasm.unavailable() is not None, reason=str(wasm.unavailable())),
    pytest.mark.asyncio(loop_scope="module"),
]

LINUX = sys.platform.startswith("linux")
FAKE_KEY = "sk-test-wasm-kernel-key-0001"
LOST = "every variable you made is lost"
CONTEXT = {"title": "report", "rows": [1, 2.5, None, True], "nested": {"a": ["b"]}}
EARLIER = [("context_0", [1, "two", {"three": 3}]), ("context_1", "plain text")]


class KernelHelpers:
    """The helpers as the kernel serves them: on which loop, how many at once, which
    were cancelled. A prompt starting with "slow" waits 30 s, any other ``delay``."""

    def __init__(self) -> None:
        self.reset()

    def reset(self, delay: float = 0.0) -> None:
        self.delay = delay
        self.prompts: list[str] = []
        self.loops: set[asyncio.AbstractEventLoop] = set()
        self.running = self.peak = 0
        self.cancelled: list[str] = []

    async def llm_query(self, prompt: str, **kwargs) -> str:
        self.loops.add(asyncio.get_running_loop())
        self.prompts.append(prompt)
        self.running += 1
        self.peak = max(self.peak, self.running)
        try:
            await asyncio.sleep(30 if prompt.startswith("slow") else self.delay)
        except asyncio.CancelledError:
            self.cancelled.append(prompt)
            raise
        finally:
            self.running -= 1
        return f"answer: {prompt}"

    async def llm_query_batch(self, prompts: list[str], **kwargs) -> list[str]:
        return list(await asyncio.gather(*(self.llm_query(p) for p in prompts)))

    def table(self) -> dict:
        return {"llm_query": self.llm_query, "llm_query_batch": self.llm_query_batch}


KERNEL = KernelHelpers()


def wasm_repl(context, **kwargs) -> SandboxREPL:
    return SandboxREPL(context, KERNEL.table(), launcher=wasm.launch, **kwargs)


@pytest.fixture(scope="module")
def secret_env():
    """A fake key in the kernel's environment while this module's sandboxes start."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("OPENAI_API_KEY", FAKE_KEY)
        yield FAKE_KEY


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def box(secret_env):
    repl = wasm_repl(
        CONTEXT,
        session=SessionStart(
            earlier_contexts=tuple((name, pickle.dumps(value)) for name, value in EARLIER)
        ),
    )
    await repl.start()
    await repl.run("pass")  # started: its process is there to look at
    yield repl
    await repl.aclose()


@pytest.fixture(autouse=True)
def _fresh_helpers():
    KERNEL.reset()


async def run(repl: SandboxREPL, code: str, timeout: float = 30):
    return await repl.run(code, timeout=timeout)


def last_line(error: str | None) -> str:
    return (error or "").strip().splitlines()[-1] if error else ""


def deno(repl: SandboxREPL) -> subprocess.Popen[bytes]:
    """The Deno process of the sandbox that runs now."""
    assert repl._sandbox is not None
    return repl._sandbox.process


def ended(process: subprocess.Popen[bytes]) -> bool:
    """Ended and reaped: no zombie is left."""
    return process.poll() is not None


def runners() -> set[int]:
    """Live processes of this one's running this package's runner.js."""
    found = set()
    for entry in os.listdir("/proc"):
        try:
            with open(f"/proc/{entry}/stat") as stat:
                state, parent = stat.read().rsplit(")", 1)[1].split()[:2]
            with open(f"/proc/{entry}/cmdline", "rb") as cmdline:
                mine = b"runner.js" in cmdline.read() and int(parent) == os.getpid()
        except (OSError, ValueError):
            continue
        if mine and state not in ("Z", "X"):
            found.add(int(entry))
    return found


def rss_mb(pid: int) -> float:
    """A process's resident memory (Deno's Web Workers are threads of it), in MB."""
    try:
        with open(f"/proc/{pid}/status") as status:
            return next(int(line.split()[1]) for line in status if line.startswith("VmRSS:")) / 1024
    except (OSError, StopIteration):
        return 0.0


linux_only = pytest.mark.skipif(not LINUX, reason="reads Deno's process from /proc")


class Listener:
    """A TCP server on 127.0.0.1 that counts the connections it accepts."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]
        self.accepted = 0
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.accepted += 1
            conn.close()

    def close(self) -> None:
        self.sock.close()


# -- steps and data --------------------------------------------------------------------


async def test_a_step_runs_prints_and_keeps_its_variables_for_the_next(box):
    first = await run(box, "x = 41\nprint('hello from wasm')")
    second = await run(box, "x += 1\nx")
    assert (first.stdout, first.error) == ("hello from wasm\n", None)
    assert second.value == "42" and second.error is None


async def test_the_context_arrives_as_data_under_each_of_its_names(box):
    output = await run(
        box,
        "print(json.dumps([context, type(context).__name__, context_0, context_1,"
        " type(context_1).__name__]))",
    )
    assert output.error is None, output.error
    assert json.loads(output.stdout) == [CONTEXT, "dict", EARLIER[0][1], "plain text", "str"]


async def test_a_20_mb_string_context_arrives_whole():
    context = "é" + "y" * 20_000_000 + "end"
    repl = wasm_repl(context)
    started = time.perf_counter()
    try:
        await repl.start()
        output = await run(repl, "print(len(context), context[0], context[-3:])")
    finally:
        await repl.aclose()
    assert output.stdout == "20000004 é end\n", output.error
    assert time.perf_counter() - started < 60  # generous: the figure is in benchmarks/


class Document:  # the sandbox cannot import this module: like a class made in a notebook
    text = "hi"


def _dataframe():
    pandas = pytest.importorskip("pandas")
    return pandas.DataFrame({"a": [1, 2]})


@pytest.mark.parametrize(
    "make, missing", [(Document, Document.__module__.split(".")[0]), (_dataframe, "pandas")]
)
async def test_a_context_the_wasm_sandbox_cannot_unpickle_fails_in_one_line(make, missing):
    repl = wasm_repl(make())
    try:
        await repl.start()  # pickled in the kernel: fine
        with pytest.raises(SandboxError) as failed:
            await run(repl, "print(context)")
    finally:
        await repl.aclose()
    message = str(failed.value)
    assert "\n" not in message
    assert "could not be unpickled in the sandbox" in message
    assert f"No module named '{missing}" in message
    assert "RLM.sandbox = 'process'" in message  # what to do about it


# -- helpers, served on the kernel's loop ------------------------------------------------


async def test_llm_query_is_answered_by_the_helper_on_the_kernel_loop(box):
    output = await run(box, "print(llm_query('hi'))")
    assert output.stdout == "answer: hi\n" and output.error is None
    assert KERNEL.loops == {asyncio.get_running_loop()}


async def test_a_batch_of_64_prompts_reaches_the_helper_at_once(box):
    KERNEL.reset(delay=0.3)
    started = time.perf_counter()
    output = await run(
        box, "r = llm_query_batch([f'p{i}' for i in range(64)])\nprint(len(r), r[63])"
    )
    assert output.stdout == "64 answer: p63\n", output.error
    assert KERNEL.peak == 64
    assert time.perf_counter() - started < 64 * 0.3 / 4  # one after another: 19 s


async def test_top_level_gather_of_helper_calls_overlaps_in_the_kernel(box):
    KERNEL.reset(delay=0.3)
    output = await run(
        box,
        "r = await asyncio.gather(*(llm_query(f'g{i}') for i in range(8)))\nprint(r[0], len(r))",
    )
    assert output.stdout == "answer: g0 8\n", output.error
    assert KERNEL.peak == 8  # all eight in flight in the kernel at once
    assert KERNEL.loops == {asyncio.get_running_loop()}


async def test_a_call_the_code_stops_waiting_for_is_cancelled_in_the_kernel(box):
    output = await run(
        box,
        "try:\n    await asyncio.wait_for(llm_query('slow one'), 0.3)\n"
        "except asyncio.TimeoutError:\n    print('gave up')",
    )
    assert output.stdout == "gave up\n", output.error
    assert await eventually(lambda: KERNEL.cancelled == ["slow one"], timeout=5)


async def test_an_oversized_helper_argument_is_refused_in_one_line(box):
    output = await run(box, "llm_query('y' * 20_000_000)")
    assert re.fullmatch(
        r"ValueError: llm_query\(\): a 20,000,0\d\d-byte message, over the 8,388,608-byte "
        r"limit of the sandbox's bridge; send less per call",
        last_line(output.error),
    ), output.error
    assert KERNEL.prompts == []
    assert (await run(box, "print('still here')")).stdout == "still here\n"


# -- attacks on the host -----------------------------------------------------------------

# Each attempt prints what it reached, or the first line of its refusal.
_ATTEMPTS = """
import js, json
from pyodide.ffi import to_js
def options(**fields):
    return to_js(fields, dict_converter=js.Object.fromEntries)
out = {}
def attempt(name, action):
    try:
        out[name] = 'REACHED ' + str(action())[:200]
    except BaseException as e:
        out[name] = f'{type(e).__name__}: {e}'.splitlines()[0][:200]
"""

READ_FILES = (
    _ATTEMPTS
    + """
import pyodide_js
FS = pyodide_js.FS
def mount_host():
    FS.mkdir('/host')
    FS.mount(FS.filesystems.NODEFS, options(root='/'), '/host')
    return open('/host' + context_secret).read()
for label, path in (('secret', context_secret), ('passwd', '/etc/passwd')):
    attempt('python ' + label, lambda: open(path).read())
    attempt('deno ' + label, lambda: js.Deno.readTextFileSync(path))
attempt('deno folder', lambda: list(js.Deno.readDirSync(context_folder)))
attempt('node filesystem mounted', mount_host)
ask = js.Deno.permissions.requestSync
attempt('read permission asked for', lambda: ask(options(name='read')).state)
print(json.dumps(out))
"""
)


async def test_host_files_cannot_be_read_from_python_or_javascript(box, tmp_path):
    secret = tmp_path / "secret.txt"
    secret.write_text("the-secret-0002")
    await box.set_variable("context_secret", str(secret))
    await box.set_variable("context_folder", str(tmp_path))
    output = await run(box, READ_FILES)
    assert output.error is None, output.error
    got = json.loads(output.stdout)
    assert "the-secret-0002" not in output.stdout and "root:" not in output.stdout
    assert got["python secret"].startswith("FileNotFoundError")  # Pyodide's own memory fs
    assert got["python passwd"].startswith("FileNotFoundError")
    for name in ("deno secret", "deno passwd", "deno folder", "node filesystem mounted"):
        assert got[name].startswith("JsException: NotCapable: Requires read access"), got
    assert got["read permission asked for"] == "REACHED denied"


NETWORK = (
    _ATTEMPTS
    + """
import socket, time, urllib.request
port = context_port
url = f'http://127.0.0.1:{port}/'
attempt('python socket', lambda: socket.create_connection(('127.0.0.1', port), timeout=2))
attempt('urllib', lambda: urllib.request.urlopen(url, timeout=2))
attempt('listen', lambda: js.Deno.listen(options(port=0)))
# Promises the main thread fires (it never turns JavaScript's loop while Python runs).
fired = [js.fetch(url), js.Deno.connect(options(hostname='127.0.0.1', port=port))]
# No Web Worker: one would run on past a stopped step, with a loop of its own.
out['worker'] = 'Worker available' if hasattr(js, 'Worker') else 'no Worker'
print(json.dumps(out))
"""
)


async def test_nothing_model_code_stores_outlives_its_sandbox(box):
    # Web Storage and the Cache API write under Deno's cache folder without asking for
    # write access: the runner removes them (and Workers, which would have their own).
    store = (
        "import js\n"
        "print([n for n in ('localStorage', 'sessionStorage', 'caches', 'Worker',"
        " 'SharedWorker') if hasattr(js, n) or js.eval(f'typeof {n}') != 'undefined'])"
    )
    output = await run(box, store)
    assert (output.stdout, output.error) == ("[]\n", None)
    assert not (wasm.cache_dir() / "location_data").exists()


async def test_the_network_is_unreachable_from_python_javascript_and_web_workers(box):
    server = Listener()
    try:
        await box.set_variable("context_port", server.port)
        output = await run(box, NETWORK)
        awaited = await run(box, "r = await js.fetch(url)", timeout=2)
        after = await run(box, "print(port == context_port)")
        await asyncio.sleep(0.3)  # a connection made last would be accepted by now
    finally:
        server.close()
    assert output.error is None, output.error
    got = json.loads(output.stdout)
    assert got["python socket"].startswith("OSError") and got["urllib"].startswith("URLError")
    assert got["listen"].startswith("JsException: NotCapable: Requires net access")
    assert got["worker"] == "no Worker"
    # An awaited JavaScript promise never settles (JavaScript's loop does not turn while
    # Python runs): the step ends, by its timeout or at once, with the namespace kept.
    assert awaited.error and LOST not in awaited.error
    assert after.stdout == "True\n"
    assert server.accepted == 0


ENVIRONMENT = (
    _ATTEMPTS
    + """
import os
attempt('python environ', lambda: sorted(os.environ.items()))
attempt('deno environ', lambda: js.Deno.env.toObject())
attempt('deno variable', lambda: js.Deno.env.get('OPENAI_API_KEY'))
attempt('node environ', lambda: js.process.env.OPENAI_API_KEY)
attempt('proc environ', lambda: js.Deno.readTextFileSync('/proc/self/environ'))
print(json.dumps(out))
"""
)


async def test_the_kernel_environment_leaves_no_trace_in_the_sandbox(box, secret_env):
    output = await run(box, ENVIRONMENT)
    assert output.error is None, output.error
    got = json.loads(output.stdout)
    assert secret_env not in output.stdout and "OPENAI_API_KEY'" not in got["python environ"]
    for name in ("deno environ", "deno variable", "node environ"):
        assert got[name].startswith("JsException: NotCapable: Requires env access"), got
    assert got["proc environ"].startswith("JsException: NotCapable: Requires read access")
    if not LINUX:
        return
    # Nor does Deno's own process hold it: its environment is the backend's own names.
    with open(f"/proc/{deno(box).pid}/environ", "rb") as environ:
        held = environ.read()
    assert secret_env.encode() not in held
    names = {entry.split(b"=", 1)[0].decode() for entry in held.split(b"\0") if entry}
    assert names == set(wasm._deno_environment())


@pytest.mark.parametrize(
    "code, refusal",
    [
        (
            "import subprocess\nsubprocess.run(['ls'])",
            "OSError: subprocesses are not available in the wasm sandbox (RLM.sandbox = 'wasm')",
        ),
        (
            "import os\nos.popen('ls')",
            "OSError: subprocesses are not available in the wasm sandbox (RLM.sandbox = 'wasm')",
        ),
        (
            "import threading\nthreading.Thread(target=print).start()",
            "RuntimeError: threads are not available in the wasm sandbox",
        ),
        (
            "import concurrent.futures\nconcurrent.futures.ThreadPoolExecutor().submit(print)",
            "RuntimeError: threads are not available in the wasm sandbox",
        ),
        (
            "import js\njs.Deno.Command.new('/bin/sh', options(args=['-c', f'touch {marker}']))"
            ".outputSync()",
            'JsException: NotCapable: Requires run access to "/bin/sh"',
        ),
        (
            "import js\njs.Deno.dlopen('libc.so.6', options())",
            'JsException: NotCapable: Requires ffi access to "libc.so.6"',
        ),
    ],
    ids=["subprocess", "popen", "thread", "thread pool", "deno command", "ffi"],
)
async def test_processes_threads_and_ffi_fail_in_one_line(box, tmp_path, code, refusal):
    marker = tmp_path / "ran"
    await box.set_variable("marker", str(marker))
    output = await run(box, _ATTEMPTS + code)
    assert last_line(output.error).replace("pyodide.ffi.", "").startswith(refusal)
    assert LOST not in output.error and not marker.exists()


async def test_os_system_fails_in_one_line_and_the_sandbox_lives_on(box):
    await run(box, "kept = 'yes'")
    output = await run(box, "import os\nos.system('ls')")
    assert LOST not in (output.error or ""), output.error  # it crashed Pyodide
    assert last_line(output.error).startswith("OSError: subprocesses are not available")
    assert (await run(box, "print(kept)")).stdout == "yes\n"


KERNEL_PROCESS = (
    _ATTEMPTS
    + """
import os
attempt('python kill', lambda: os.kill(context_victim, 9))
attempt('deno kill', lambda: js.Deno.kill(context_victim, 'SIGKILL'))
attempt('deno signal kernel', lambda: js.Deno.kill(context_kernel, 'SIGCONT'))
attempt('python kernel memory', lambda: open(f'/proc/{context_kernel}/mem', 'rb').read(1))
attempt('deno kernel memory', lambda: js.Deno.readFileSync(f'/proc/{context_kernel}/mem'))
print(json.dumps(out))
"""
)


async def test_the_kernel_and_its_other_processes_are_out_of_reach(box):
    victim = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        await box.set_variable("context_victim", victim.pid)
        await box.set_variable("context_kernel", os.getpid())
        output = await run(box, KERNEL_PROCESS)
        assert victim.poll() is None  # still running
    finally:
        victim.kill()
        victim.wait()
    assert output.error is None, output.error
    got = json.loads(output.stdout)
    assert got["python kill"].startswith("PermissionError")  # Emscripten's: no host pids
    assert got["deno kill"].startswith("JsException: NotCapable: Requires run access")
    assert got["deno signal kernel"].startswith("JsException: NotCapable: Requires run access")
    assert got["python kernel memory"].startswith("FileNotFoundError")
    assert got["deno kernel memory"].startswith("JsException: NotCapable: Requires read access")


async def test_isolation_lists_the_wasm_layers_and_each_holds(box):
    layers = box.isolation
    assert layers is not None and box.network_isolated is True
    assert set(layers) == {*wasm.WasmProcess.LAYERS, "notes"}
    assert all(layers[name] is True for name in wasm.WasmProcess.LAYERS)
    assert set(layers["notes"]) == set(wasm.WasmProcess.LAYERS)
    # What the notes claim, as Deno was started: no permission beyond reading Pyodide's
    # files and the host folder (revoked once loaded), a memory cap.
    flags = [str(part) for part in deno(box).args]
    granted = [flag for flag in flags if flag.startswith(("--allow", "-A"))]
    assert [flag.split("=")[0] for flag in granted] == ["--allow-read"]
    for path in granted[0].split("=", 1)[1].split(","):
        assert path.startswith((str(wasm.cache_dir()), str(wasm.HOST))), path
    assert any("--wasm-max-mem-pages=" in flag for flag in flags)
    await box.set_variable("pyodide_folder", str(wasm._pyodide_folder()))
    await box.set_variable("runner", str(wasm._RUNNER))
    output = await run(
        box,
        _ATTEMPTS + "attempt('own files', lambda: js.Deno.readDirSync(pyodide_folder))\n"
        "attempt('runner', lambda: js.Deno.readTextFileSync(runner))\n"
        "print(json.dumps(out))",
    )
    got = json.loads(output.stdout)
    assert all(
        v.startswith("JsException: NotCapable: Requires read access") for v in got.values()
    ), got


# -- steps that do not end, and memory ---------------------------------------------------


@pytest.mark.parametrize("code", ["while True:\n    pass", "import time\ntime.sleep(30)"])
async def test_a_step_that_does_not_end_stops_at_its_timeout_and_keeps_the_namespace(box, code):
    await run(box, "kept = 'yes'")
    process = deno(box)
    started = time.perf_counter()
    output = await run(box, code, timeout=1)
    elapsed = time.perf_counter() - started
    assert output.timed_out and "ran longer than 1s" in output.error
    assert LOST not in output.error and elapsed < 2.5
    assert (await run(box, "print(kept)")).stdout == "yes\n" and deno(box) is process


@pytest.mark.parametrize("seconds", [0.3, 0.45, 0.6, 0.75])
async def test_an_interrupt_amid_streaming_answers_never_cuts_a_frame(box, seconds):
    # Answers of 5,000 characters stream in while the step is stopped: the stop waits
    # for the frame being read, so the sandbox's bridge stays whole and the next step
    # runs in the same process with the namespace kept.
    await run(box, "kept = 41")
    process = deno(box)
    code = "n = 0\nwhile True:\n    llm_query('x' * 5000)\n    n += 1"
    output = await run(box, code, timeout=seconds)
    assert output.timed_out and LOST not in output.error
    after = await run(box, "print(kept, n > 0)")
    assert (after.stdout, after.error, deno(box)) == ("41 True\n", None, process)


async def test_an_interrupt_gets_through_while_answers_fill_the_ring(box):
    # Twelve 1 MB answers arrive while the step computes without reading them: more
    # than the ring between Deno's reader and Python holds. The interrupt behind them
    # still stops the step, keeping the namespace (not a kill after the grace period).
    await run(box, "kept = 41")
    process = deno(box)
    code = (
        "async def flood():\n"
        "    calls = [asyncio.ensure_future(llm_query(str(i) + 'x' * 2**20)) for i in range(12)]\n"
        "    await asyncio.sleep(0)  # they go out\n"
        "    while True:\n"
        "        pass\n"
        "await flood()"
    )
    output = await run(box, code, timeout=1.5)
    assert output.timed_out and LOST not in output.error, output.error
    after = await run(box, "print(kept)")
    assert (after.stdout, deno(box)) == ("41\n", process)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def small_box():
    repl = wasm_repl("c", settings=SandboxSettings(memory_mb=512))
    await repl.start()
    await repl.run("pass")  # started: its process is there to look at
    yield repl
    await repl.aclose()


async def test_a_memory_hog_gets_memory_error_and_the_sandbox_works_on(small_box):
    first = await run(small_box, "kept = 'yes'\nhuge = bytearray(2**30)")
    second = await run(
        small_box, "chunks = []\nwhile True:\n    chunks.append(bytearray(50 * 2**20))"
    )
    third = await run(small_box, "del chunks\nprint(kept)")
    assert last_line(first.error) == "MemoryError" and last_line(second.error) == "MemoryError"
    assert third.stdout == "yes\n" and third.error is None
    if LINUX:
        assert rss_mb(deno(small_box).pid) < 512 + 512  # the cap, and Deno's own


@linux_only
async def test_memory_model_code_takes_through_javascript_is_capped_too(small_box):
    # 1 GB of filled typed arrays, in pieces Python can be interrupted between; the
    # kernel watches the process's resident memory meanwhile.
    pid, peak = deno(small_box).pid, 0.0

    async def watch():
        nonlocal peak
        while True:
            peak = max(peak, rss_mb(pid))
            await asyncio.sleep(0.05)

    watcher = asyncio.ensure_future(watch())
    try:
        output = await run(
            small_box,
            "import js\nheld = []\nfor _ in range(16):\n"
            "    held.append(js.Uint8Array.new(64 * 2**20).fill(1))\nprint('all held')",
            timeout=20,
        )
    finally:
        watcher.cancel()
    assert peak < 512 + 512 and "all held" not in output.stdout, (
        f"{peak:.0f} MB resident with memory_mb=512: {output.stdout!r} {output.error!r}"
    )


# -- the bridge is a trust boundary (each of these ends its sandbox) --------------------


def _forged(data: bytes) -> str:
    """Model code that writes ``data`` to Deno's stdout, the kernel's end of the bridge."""
    return (
        "import js, time\nfrom pyodide.ffi import to_js\n"
        f"js.Deno.stdout.writeSync(to_js({data!r}))\ntime.sleep(5)"
    )


def _json_frame(body: bytes) -> bytes:
    return struct.pack(">cQ", b"J", len(body)) + body


@pytest.mark.parametrize(
    "data, complaint",
    [
        (_json_frame(b"{not json"), "not JSON"),
        (struct.pack(">cQ", b"J", 2**40), "over the"),
        (struct.pack(">cQ", b"P", 5) + pickle.dumps(1)[:5], "unexpected frame kind"),
        (_json_frame(b'{"op": "call", "id": 1, "name": 5}'), "malformed helper call"),
    ],
    ids=["not json", "oversized", "pickle", "malformed call"],
)
async def test_forged_frames_end_that_sandbox_and_the_next_step_runs_in_a_fresh_one(
    box, data, complaint
):
    await run(box, "made_here = 1")
    process = deno(box)
    started = time.perf_counter()
    broken = await run(box, _forged(data))
    assert time.perf_counter() - started < 4  # not the step's own 5 s sleep
    assert broken.error.startswith("SandboxError: it broke the bridge protocol")
    assert complaint in broken.error and LOST in broken.error
    after = await run(box, "print('made_here' in dir(), type(context).__name__)")
    assert after.stdout == "False dict\n" and ended(process) and deno(box) is not process


async def test_a_javascript_loop_that_ignores_interrupts_is_killed_and_the_model_told(box):
    process = deno(box)
    output = await run(box, "import js\njs.eval('for (;;) {}')", timeout=1)
    assert output.timed_out and LOST in output.error
    assert output.elapsed_s < 1 + 1.5
    assert await eventually(lambda: ended(process), timeout=5)
    assert (await run(box, "print(len(context))")).stdout == f"{len(CONTEXT)}\n"


# -- sessions and the end ----------------------------------------------------------------


async def test_a_session_carries_variables_into_a_new_wasm_sandbox(box):
    await run(box, "notes = ['a', 'b']\ncounts = {'x': 1}\ndef helper(): pass")
    carried = await box.carry_out()
    assert {"notes", "counts"} <= set(carried.names)
    assert ("helper", "function") in carried.left
    follow_up = wasm_repl("next context", session=SessionStart(carried=carried))
    try:
        await follow_up.start()
        output = await run(follow_up, "print(notes, counts, context, 'helper' in dir())")
    finally:
        await follow_up.aclose()
    assert output.stdout == "['a', 'b'] {'x': 1} next context False\n", output.error


async def test_no_deno_process_is_left_after_aclose():
    before = runners() if LINUX else set()
    repl = wasm_repl("c")
    await repl.start()
    # A timer of model code's (its Workers are gone) must not keep Deno alive.
    await run(repl, "import js\ntimer = js.eval('setInterval(() => 0, 1000)')")
    process = deno(repl)
    assert not ended(process)
    await repl.aclose()
    assert ended(process)  # killed and reaped
    if LINUX:
        assert runners() <= before  # and nothing it started runs on
