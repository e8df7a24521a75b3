"""RLM.sandbox = "container": model code runs in the process worker inside a Docker or
Podman container, and what model code tries against the kernel fails there.

Real containers (skipped with the reason where no runtime runs one, or the image is not
built: ``bash rlm_magic/repl/backends/container_host/build_image.sh``). One container
serves most tests; those that kill theirs start their own."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import time

import pytest
import pytest_asyncio

from rlm_magic.errors import SandboxError
from rlm_magic.repl.backends import container
from rlm_magic.repl.base import SandboxSettings
from rlm_magic.repl.carried import SessionStart
from rlm_magic.repl.sandbox import SandboxREPL

from .support import MEASURED, eventually

_WHY_NOT = container.unavailable() if sys.platform.startswith("linux") else "Linux only"
pytestmark = [
    pytest.mark.skipif(_WHY_NOT is not None, reason=f"no container sandbox: {_WHY_NOT}"),
    pytest.mark.asyncio(loop_scope="module"),
]
SETTINGS = SandboxSettings(memory_mb=512, max_processes=32, disk_mb=64)
FAKE_KEY = "sk-fake-container-0042"
LOST = "every variable you made is lost"


class Helpers:
    """llm_query and llm_query_batch as the kernel serves them: coroutines on its loop."""

    def __init__(self) -> None:
        self.loops: set[asyncio.AbstractEventLoop] = set()
        self.in_flight = self.peak = 0

    async def llm_query(self, prompt: str, *args: object, **kwargs: object) -> str:
        self.loops.add(asyncio.get_running_loop())
        self.in_flight += 1
        self.peak = max(self.peak, self.in_flight)
        try:
            await asyncio.sleep(0.05)
            return f"echo: {prompt}"
        finally:
            self.in_flight -= 1

    async def llm_query_batch(self, prompts: list[str], *args: object, **kw: object) -> list[str]:
        return list(await asyncio.gather(*(self.llm_query(p) for p in prompts)))

    def as_dict(self) -> dict:
        return {"llm_query": self.llm_query, "llm_query_batch": self.llm_query_batch}


def _runtime() -> container.Runtime:
    found = container.runtime()
    assert isinstance(found, container.Runtime), found
    return found


def _containers() -> set[str]:
    """The names of every container the runtime holds, running or not."""
    listed = subprocess.run(
        [_runtime().binary, "ps", "-a", "--format", "{{.Names}}"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert listed.returncode == 0, listed.stderr
    return set(listed.stdout.split())


def _new_repl(helpers: Helpers | None = None, **kwargs: object) -> SandboxREPL:
    return SandboxREPL(
        "ctx",
        (helpers or Helpers()).as_dict(),
        launcher=container.launch,
        settings=kwargs.pop("settings", SETTINGS),  # type: ignore[arg-type]
        **kwargs,  # type: ignore[arg-type]
    )


@pytest.fixture(scope="module")
def helpers() -> Helpers:
    return Helpers()


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def repl(helpers):
    """One container for the module, started while the kernel holds a key in its
    environment (as a notebook's OPENAI_API_KEY)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("OPENAI_API_KEY", FAKE_KEY)
        sandbox = _new_repl(helpers, secrets=(FAKE_KEY,))
        started = time.perf_counter()
        await sandbox.start()
        await sandbox.run("pass")
        MEASURED["container sandbox: start to first step"] = time.perf_counter() - started
    yield sandbox
    await sandbox.aclose()


async def test_a_step_runs_in_a_container_and_the_next_sees_its_variables(repl):
    first = await repl.run("x = 41\nprint(context)")
    second = await repl.run("print(x + 1)")
    assert (first.as_text(), second.as_text()) == ("ctx", "42")
    started = time.perf_counter()
    for _ in range(100):
        await repl.run("pass")
    MEASURED["container sandbox: 100 empty steps"] = time.perf_counter() - started


async def test_helpers_called_from_model_code_and_its_threads_are_served_on_the_kernels_loop(
    repl, helpers
):
    out = await repl.run(
        "import concurrent.futures\n"
        "one = llm_query('hi')\n"
        "many = llm_query_batch([f'p{i}' for i in range(64)])\n"
        "with concurrent.futures.ThreadPoolExecutor(8) as pool:\n"
        "    threaded = list(pool.map(llm_query, [f't{i}' for i in range(16)]))\n"
        "print(one, len(many), many[0], many[63], len(threaded), threaded[15])"
    )
    assert out.as_text() == "echo: hi 64 echo: p0 echo: p63 16 echo: t15"
    assert helpers.loops == {asyncio.get_running_loop()}
    assert helpers.peak >= 64  # the batch's prompts were served at once


async def test_what_model_code_tries_against_the_kernel_fails(repl, tmp_path):
    kernels_file = tmp_path / "kernel-notes.txt"  # in the host's temp folder
    kernels_file.write_text("fake-0042")
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    server.setblocking(False)
    attempts = {
        "shadow": "open('/etc/shadow').read()",
        "kernel file": f"open({str(kernels_file)!r}).read()",
        "package": f"open({container.__file__!r}).read()",
        "kernel port": f"socket.create_connection(('127.0.0.1', {server.getsockname()[1]}), 2)",
        "internet": "socket.create_connection(('1.1.1.1', 443), 2)",
        "root": "open('/usr/evil', 'w')",
        "pid 1's environment": "open('/proc/1/environ', 'rb').read()",
        "pid 1's stderr": "open('/proc/1/fd/2', 'wb')",
        "pid 1's memory": "open('/proc/1/mem', 'rb')",
        "disk": "open('big', 'wb').write(b'x' * (80 * 2**20))",
    }
    code = "import json, os, socket\nfailed = {}\n"
    for name, attempt in attempts.items():
        code += (
            f"try:\n    {attempt}\n    failed[{name!r}] = 'ALLOWED'\n"
            f"except OSError as e:\n    failed[{name!r}] = e.strerror\n"
        )
    code += (
        "os.path.exists('big') and os.remove('big')\n"
        f"failed['key'] = any({FAKE_KEY!r} in v for v in os.environ.values())\n"
        "print(json.dumps(failed))"
    )
    try:
        failed = json.loads((await repl.run(code)).as_text())
        with pytest.raises(BlockingIOError):
            server.accept()  # nothing reached the kernel's port
    finally:
        server.close()
    assert failed == {
        "shadow": "Permission denied",
        "kernel file": "No such file or directory",
        "package": "No such file or directory",
        "kernel port": "Connection refused",  # the container's own loopback
        "internet": "Network is unreachable",
        "root": "Read-only file system",
        "pid 1's environment": "Permission denied",  # the supervisor's: not model code's
        "pid 1's stderr": "Permission denied",
        "pid 1's memory": "Permission denied",
        "disk": "No space left on device",
        "key": False,
    }


async def test_a_fork_bomb_stops_at_the_process_limit_and_the_namespace_lives(repl):
    await repl.run("x = 41")
    out = await repl.run(
        "import os, signal, time\nborn, refused = [], None\n"
        "try:\n"
        "    for _ in range(1000):\n"
        "        pid = os.fork()\n"
        "        if pid == 0:\n"
        "            time.sleep(60)\n"
        "            os._exit(0)\n"
        "        born.append(pid)\n"
        "except OSError as e:\n"
        "    refused = type(e).__name__\n"
        "for pid in born:\n"
        "    os.kill(pid, signal.SIGKILL)\n"
        "    os.waitpid(pid, 0)\n"
        "print(len(born), refused)"
    )
    born, refused = out.as_text().split()
    assert 0 < int(born) < SETTINGS.max_processes and refused == "BlockingIOError"
    assert (await repl.run("print(x)")).as_text() == "41"


async def test_a_runaway_step_is_stopped_within_a_second_and_keeps_the_namespace(repl):
    await repl.run("kept = 'yes'")
    stopped = await repl.run("while True:\n    pass", timeout=1)
    assert stopped.timed_out and "ran longer than 1s" in stopped.error
    assert LOST not in stopped.error and stopped.elapsed_s < 2.5
    assert (await repl.run("print(kept)")).as_text() == "yes"


async def test_the_isolation_report_says_what_model_code_finds(repl):
    seen = json.loads(
        (
            await repl.run(
                "import json, os\n"
                "lines = [line.split(':\\t', 1) for line in open('/proc/self/status')]\n"
                "status = dict(line for line in lines if len(line) == 2)\n"
                "def cgroup(*paths):\n"
                "    for p in paths:\n"
                "        if os.path.exists(p):\n"
                "            return open(p).read().strip()\n"
                "print(json.dumps({'uid': os.getuid(), 'caps': int(status['CapEff'], 16),\n"
                "    'root_writable': os.access('/', os.W_OK),\n"
                "    'net': os.listdir('/sys/class/net'),\n"
                "    'pids': cgroup('/sys/fs/cgroup/pids.max', '/sys/fs/cgroup/pids/pids.max'),\n"
                "    'memory': cgroup('/sys/fs/cgroup/memory.max',\n"
                "                     '/sys/fs/cgroup/memory/memory.limit_in_bytes')}))"
            )
        ).as_text()
    )
    assert seen == {
        "uid": 65534,
        "caps": 0,
        "root_writable": False,
        "net": ["lo"],
        "pids": str(SETTINGS.max_processes),
        "memory": str(SETTINGS.memory_mb * 2**20),
    }
    layers = {name: repl.isolation[name] for name in container.ContainerProcess.LAYERS}
    assert layers == dict.fromkeys(layers, True)
    notes = repl.isolation["notes"]
    assert _runtime().name in notes["container"] and "uid 65534" in notes["user"]
    assert f"{SETTINGS.max_processes} processes" in notes["processes"]
    assert f"{SETTINGS.memory_mb} MB" in notes["memory"]


async def test_a_sessions_variables_carry_to_a_new_container_and_it_is_gone_after_close(repl):
    await repl.run("notes = {'a': [1, 2]}\nx = 41")
    carried = await repl.carry_out()
    assert "notes" in carried.names
    later = _new_repl(session=SessionStart(carried=carried))
    await later.start()
    try:
        assert (await later.run("print(notes, x)")).as_text() == "{'a': [1, 2]} 41"
        name = later._sandbox.name
        assert name in _containers()
    finally:
        await later.aclose()
    assert name not in _containers()


async def test_a_memory_hog_is_killed_and_said_and_the_next_step_runs_in_a_fresh_container(
    tmp_path, monkeypatch
):
    monkeypatch.chdir(tmp_path)  # the notebook's folder, which the kill must leave alone
    hog = _new_repl(settings=SandboxSettings(memory_mb=128, max_processes=16, disk_mb=8))
    await hog.start()
    try:
        killed = await hog.run("kept = 1\nhog = b'x' * (400 * 2**20)")
        first = hog._sandbox.name
        after = await hog.run("print('kept' in dir(), context)")
        assert first not in _containers()  # removed when the next one started
    finally:
        await hog.aclose()
    assert "ran out of memory" in killed.error and "limit of 128 MB" in killed.error
    assert LOST in killed.error and after.as_text() == "False ctx"
    assert list(tmp_path.iterdir()) == []  # (podman's monitor wrote "oom" where it ran)


async def test_a_step_that_ignores_the_interrupt_is_killed_with_its_container():
    stuck = _new_repl()
    await stuck.start()
    try:
        await stuck.run("kept = 1")
        name = stuck._sandbox.name
        killed = await stuck.run(
            "import signal\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\nwhile True:\n    pass",
            timeout=1,
        )
        assert await eventually(lambda: name not in _containers(), timeout=10)
        after = await stuck.run("print('kept' in dir())")
    finally:
        await stuck.aclose()
    assert killed.timed_out and LOST in killed.error and killed.elapsed_s < 3
    assert after.as_text() == "False"


async def test_an_image_that_is_not_built_is_said_in_one_line_naming_the_command_that_builds_it(
    monkeypatch,
):
    monkeypatch.setenv("RLM_CONTAINER_RUNTIME", _runtime().name)
    monkeypatch.setenv("RLM_CONTAINER_IMAGE", "localhost/rlm-no-such-image")
    why = container.unavailable()
    assert why is not None and "\n" not in why
    assert "localhost/rlm-no-such-image" in why and why.endswith(container.BUILD_IMAGE)


def _pipes() -> set[str]:
    """The pipes this process holds open (``pipe:[inode]``: a new pipe has a new inode)."""
    held = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue  # closed since listed
        if target.startswith("pipe:"):
            held.add(target)
    return held


async def test_a_closed_sandbox_leaves_none_of_its_pipes_open_in_the_kernel():
    before = _pipes()
    sandbox = _new_repl()
    await sandbox.start()
    assert (await sandbox.run("print(1)")).as_text() == "1"
    assert _pipes() - before  # its stdout and stderr, at least
    await sandbox.aclose()
    assert await eventually(lambda: not _pipes() - before, timeout=5), _pipes() - before


async def test_a_container_that_never_answers_the_handshake_fails_in_one_line_and_is_removed(
    monkeypatch,
):
    monkeypatch.setattr(container, "HANDSHAKE_S", 1.0)
    monkeypatch.setattr(container, "BOOT", "import time\ntime.sleep(600)")
    stalled = _new_repl()
    started = time.perf_counter()
    await stalled.start()
    try:
        with pytest.raises(SandboxError) as raised:
            await stalled.run("pass")
        name = stalled._sandbox.name
    finally:
        await stalled.aclose()
    why = str(raised.value)
    assert "did not start within 1s" in why and "\n" not in why
    assert time.perf_counter() - started < 15
    assert name not in _containers()


async def test_a_forged_exit_line_does_not_make_the_kernel_say_the_sandbox_ran_out_of_memory():
    """Model code (the supervisor's uid) writes the line pid 1 ends with, saying "oom",
    and keeps pid 1 from writing its own (a SIGINT storm from an orphan); then it dies."""
    forger = _new_repl()
    await forger.start()
    try:
        died = await forger.run(
            "import os, signal, time\n"
            f"line = b'\\n{container.EXIT_MARK} oom\\n'\n"
            "if os.fork() == 0:\n"
            "    try:\n"
            "        with open('/proc/1/fd/2', 'wb', buffering=0) as err:\n"
            "            err.write(line)\n"
            "    except OSError:\n"
            "        pass\n"
            "    while True:\n"
            "        os.kill(1, signal.SIGINT)\n"
            "time.sleep(0.3)\n"
            "os.kill(os.getpid(), signal.SIGKILL)"
        )
    finally:
        await forger.aclose()
    assert "ran out of memory" not in died.error
    assert "the sandbox process died (SIGKILL)" in died.error


async def test_an_exit_line_without_this_launchs_token_is_not_believed():
    said = f"\n{container.EXIT_MARK} oom\n{container.EXIT_MARK} wrong-token oom\n".encode()
    assert container.how_it_ended(said, "right-token") is None
    said += f"{container.EXIT_MARK} right-token signal 9\n".encode()
    assert container.how_it_ended(said, "right-token") == "signal 9"


async def test_the_runtimes_configuration_cannot_hand_the_kernels_environment_to_the_sandbox(
    tmp_path, monkeypatch
):
    """podman's containers.conf may pass the client's variables on (env_host, env): the
    client gets none of the kernel's, and the container none of the client's."""
    found = _runtime()
    if found.name != "podman":
        pytest.skip("containers.conf is podman's")
    conf = tmp_path / "containers.conf"
    conf.write_text('[containers]\nenv_host = true\nenv = ["RLM_TEST_SECRET"]\n')
    monkeypatch.setenv("CONTAINERS_CONF", str(conf))
    monkeypatch.setenv("RLM_TEST_SECRET", FAKE_KEY)
    client = container.client_environment()
    assert "RLM_TEST_SECRET" not in client and client["CONTAINERS_CONF"] == str(conf)
    show = "import os; print(os.environ.get('RLM_TEST_SECRET'))"
    plain = subprocess.run(
        [found.binary, "run", "--rm", *found.flags, *container._ulimits(), container.image()]
        + ["python3", "-c", show],
        capture_output=True,
        text=True,
        timeout=60,
    )
    if plain.stdout.strip() != FAKE_KEY:  # what this test guards against must happen here
        pytest.skip(f"this podman does not pass the configured variables on: {plain.stderr}")
    sandbox = _new_repl()
    await sandbox.start()
    try:
        seen = (await sandbox.run(show)).as_text()
        isolation = sandbox.isolation
    finally:
        await sandbox.aclose()
    assert seen == "None" and isolation is not None and isolation["environment"] is True
