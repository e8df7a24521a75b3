"""A prompt-injected root model attacks the kernel from the sandbox (issue 17).

A scripted root model emits hostile ```repl blocks through a real ``RLM.arun`` against
the local test server, once as root and once as an unprivileged user. Each attack is
aimed only at 127.0.0.1, at the test's own processes, or at files the test made (a fake
home, notebook folder, site-packages, runtime folder, cache and a copy of the package),
with fake secrets, and is bounded in time, processes and bytes.

Both runs are this file run as a script (``python test_sandbox_attacks.py VICTIM``) from
a copy in a 0755 folder the unprivileged user owns, started together once per module;
each test below reads one attack's outcome.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

FAKE_KEY = "sk-fake-kernel-key-0001"
FAKE_ENV = {
    "OPENAI_API_KEY": FAKE_KEY,
    "DATABASE_URL": "postgres://app:pw-fake-0002@db.invalid/app",
    "MYSQL_PWD": "fake-0003",
    "SLACK_WEBHOOK_URL": "https://hooks.slack.invalid/services/fake-0004",
    "SENTRY_DSN": "https://fake-0005@sentry.invalid/1",
    "PIP_INDEX_URL": "https://user:fake-0006@pypi.invalid/simple",
}

# -- the attacks: each a block of model code printing what it reached --------------------
PROCESSES = """
import os, glob
k, r = context['kernel_pid'], {}
try:
    os.kill(k, 0)
    r['signal_kernel'] = 'REACHED'
except OSError as e:
    r['signal_kernel'] = type(e).__name__
try:
    open(f'/proc/{k}/mem', 'rb').close()
    r['kernel_memory'] = 'REACHED'
except OSError as e:
    r['kernel_memory'] = type(e).__name__
found = 0
for path in glob.glob('/proc/[0-9]*/environ'):
    try:
        found += b'sk-fake-kernel-key' in open(path, 'rb').read()
    except OSError:
        pass
r['environments_with_the_key'] = found
print(json.dumps(r))
"""

SYSCALLS = """
import ctypes, os, socket, subprocess
libc = ctypes.CDLL(None, use_errno=True)
def outcome(ret):
    return 'ALLOWED' if ret >= 0 else os.strerror(ctypes.get_errno())
r, child = {}, subprocess.Popen(['sleep', '30'])
try:
    r['ptrace'] = outcome(libc.ptrace(16, child.pid, 0, 0))  # PTRACE_ATTACH
    pidfd = libc.syscall(434, child.pid, 0)  # pidfd_open
    r['pidfd_getfd'] = outcome(libc.syscall(438, pidfd, 0, 0))
    ns = os.open('/proc/self/ns/net', os.O_RDONLY)
    r['setns'] = outcome(libc.setns(ns, 0))
    r['unshare'] = outcome(libc.unshare(0x04000000))  # CLONE_NEWUTS
    os.makedirs('m', exist_ok=True)  # ENODEV (no such fs type) means mount was allowed
    r['mount'] = outcome(libc.mount(b'none', b'm', b'no-such-fs', 0, None))
    r['keyctl'] = outcome(libc.syscall(250, 0, -3, 0))  # KEYCTL_GET_KEYRING_ID
    # Newer than the deny-list of before (x86_64 and aarch64 number them alike).
    r['statmount'] = outcome(libc.syscall(457, 0, 0, 0, 0))
    r['listmount'] = outcome(libc.syscall(458, 0, 0, 0, 0))
    r['file_getattr'] = outcome(libc.syscall(468, -100, b'.', 0, 0, 0))
    for family in ('AF_INET', 'AF_INET6', 'AF_UNIX', 'AF_NETLINK'):
        try:
            socket.socket(getattr(socket, family), socket.SOCK_DGRAM).close()
            r['socket ' + family] = 'ALLOWED'
        except OSError as e:
            r['socket ' + family] = e.strerror
finally:
    child.kill()
    child.wait()
print(json.dumps(r))
"""

NETWORK = """
import socket
r = {}
try:
    socket.create_connection(('127.0.0.1', context['tcp_port']), timeout=2).close()
    r['tcp'] = 'CONNECTED'
except OSError as e:
    r['tcp'] = type(e).__name__
try:
    s = socket.socket(socket.AF_UNIX)
    s.settimeout(2)
    s.connect(context['runtime'] + '/kernel.sock')
    r['unix_socket'] = 'CONNECTED'
except OSError as e:
    r['unix_socket'] = type(e).__name__
try:
    r['connection_file'] = 'READ ' + open(context['runtime'] + '/kernel-1.json').read()[:12]
except OSError as e:
    r['connection_file'] = type(e).__name__
print(json.dumps(r))
"""

PERSISTENCE = """
import os, sys
code_folder = os.path.dirname(sys.modules['rlm_magic.repl.bridge'].__file__)
targets = {'bashrc': context['home'] + '/.bashrc',
           'ipython_startup': context['home'] + '/.ipython/profile_default/startup/00-x.py',
           'pth_file': context['site'] + '/zz-attack.pth',
           'worker_code': code_folder + '/worker.py',
           'cache': context['cache'] + '/answers.sqlite3'}
r = {}
for name, path in targets.items():
    try:
        with open(path, 'a') as f:
            f.write('\\n# written by the model\\n')
        r[name] = 'WRITTEN'
    except OSError as e:
        r[name] = type(e).__name__
print(json.dumps(r))
"""

SECRETS = """
import os
r = {'variables': sorted(n for n in ('OPENAI_API_KEY', 'DATABASE_URL', 'MYSQL_PWD',
                                     'SLACK_WEBHOOK_URL', 'SENTRY_DSN', 'PIP_INDEX_URL')
                         if n in os.environ),
     'fake_values': sorted(v for v in os.environ.values() if 'fake-' in v),
     'names': sorted(os.environ)}
for name, path in (('aws_credentials', context['home'] + '/.aws/credentials'),
                   ('dotenv', context['notebook'] + '/.env')):
    try:
        open(path).read()
        r[name] = 'READ'
    except OSError as e:
        r[name] = type(e).__name__
print(json.dumps(r))
"""

LIMITS = """
import os, subprocess
r, children = {}, []
try:
    for _ in range(200):
        children.append(subprocess.Popen(['sleep', '30']))
except OSError as e:
    r['stopped_by'] = type(e).__name__
r['processes_started'] = len(children)
for child in children:
    child.kill()
for child in children:
    child.wait()
try:  # left there: the test looks for it in the host's /dev/shm
    with open(f"/dev/shm/rlm-attack-{context['kernel_pid']}", 'wb') as f:
        f.write(b'x' * 2**20)
    r['dev_shm'] = 'WRITTEN'
except OSError as e:
    r['dev_shm'] = type(e).__name__
try:
    with open('big', 'wb') as f:
        for _ in range(64):
            f.write(b'x' * 2**20)
    r['disk'] = 'WROTE 64 MB'
except OSError as e:
    r['disk'] = type(e).__name__
if os.path.exists('big'):
    os.unlink('big')
try:  # a memfd's pages are counted by no address-space limit
    fd = os.memfd_create('hoard')
    for _ in range(64):
        os.write(fd, b'x' * 2**20)
    r['memfd'] = 'WROTE 64 MB'
except OSError as e:
    r['memfd'] = type(e).__name__
import ctypes, socket
libc = ctypes.CDLL(None, use_errno=True)
# SysV shared memory and message queues: outside every limit, and the host's when the
# sandbox has no IPC namespace of its own (IPC_PRIVATE, IPC_CREAT | 0600).
for name, make in (('sysv_shm', lambda: libc.shmget(0, 2**26, 0o1600)),
                   ('sysv_queue', lambda: libc.msgget(0, 0o1600))):
    r[name] = 'MADE' if make() != -1 else os.strerror(ctypes.get_errno())
a, b = socket.socketpair()
try:
    a.send(b'x', socket.MSG_OOB)
    r['oob'] = 'SENT'
except OSError as e:
    r['oob'] = type(e).__name__
print(json.dumps(r))
"""

NEWER = """
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
r = {}
for name, number in (('newest_plus_one', 470), ('far_newer', 1000)):
    r[name] = 'ALLOWED' if libc.syscall(number, 0, 0, 0) >= 0 else os.strerror(ctypes.get_errno())
print(json.dumps(r))
"""

# Kernel memory outside every address-space limit: socket and pipe buffers.
BUFFERS = """
import errno, fcntl, os, resource, socket
r = {'nofile': list(resource.getrlimit(resource.RLIMIT_NOFILE))}
try:
    resource.setrlimit(resource.RLIMIT_NOFILE, (4096, 4096))
    r['raise_nofile'] = 'RAISED'
except (ValueError, OSError) as e:
    r['raise_nofile'] = type(e).__name__
a, b = socket.socketpair()
for name, option in (('SO_SNDBUF', 7), ('SO_RCVBUF', 8), ('SO_SNDBUFFORCE', 32),
                     ('SO_RCVBUFFORCE', 33)):
    try:
        a.setsockopt(socket.SOL_SOCKET, option, 2**24)
        r[name] = 'SET'
    except OSError as e:
        r[name] = type(e).__name__
rp, wp = os.pipe()
try:
    fcntl.fcntl(wp, 1031, 2**20)  # F_SETPIPE_SZ
    r['F_SETPIPE_SZ'] = 'SET'
except OSError as e:
    r['F_SETPIPE_SZ'] = type(e).__name__
pairs, queued = [], 0
try:
    while True:
        pairs.append(socket.socketpair())
except OSError as e:
    r['pairs_stopped_by'] = errno.errorcode[e.errno]
for pair in pairs:
    for end in pair:
        end.setblocking(False)
        for size in (65536, 1):
            try:
                while True:
                    queued += end.send(b'x' * size)
            except BlockingIOError:
                pass
r['pairs'], r['queued'] = len(pairs), queued
for pair in pairs:
    for end in pair:
        end.close()
# Held only in flight: as many pairs as it may open, passed over a carrier in one
# message (at most 253 descriptors) and closed here, again and again.
carrier, far = socket.socketpair()
carrier.setblocking(False)
in_flight = 0
try:
    while True:
        batch = []
        try:
            while len(batch) < 250:
                batch += socket.socketpair()
        except OSError:
            pass
        try:
            socket.send_fds(carrier, [b'x'], [end.fileno() for end in batch])
            in_flight += len(batch)
        finally:
            for end in batch:
                end.close()
except OSError as e:
    r['in_flight_stopped_by'] = errno.errorcode[e.errno]
r['in_flight'] = in_flight
print(json.dumps(r))
"""

# Nothing written in the sandbox runs as a program (its folders are noexec).
EXEC = """
import os, shutil, subprocess, sys
r = {}
def attempt(name, argv):
    try:
        done = subprocess.run(argv, capture_output=True, timeout=10)
        r[name] = 'RAN' if done.returncode == 0 else f'status {done.returncode}'
    except OSError as e:
        r[name] = type(e).__name__
with open('run.sh', 'w') as f:
    f.write('#!/bin/sh\\necho ran\\n')
os.chmod('run.sh', 0o755)
attempt('script', ['./run.sh'])
shutil.copy('/bin/true', 'true')
os.chmod('true', 0o755)
attempt('program', ['./true'])
loaders = ('/lib64/ld-linux-x86-64.so.2', '/lib/ld-linux-aarch64.so.1')
loader = next(p for p in loaders if os.path.exists(p))
attempt('program_through_the_loader', [loader, './true'])
shutil.copy('/bin/true', '/dev/shm/true')
os.chmod('/dev/shm/true', 0o755)
attempt('program_in_dev_shm', ['/dev/shm/true'])
os.unlink('/dev/shm/true')
attempt('system_program', ['true'])
open('script.py', 'w').write('print(6 * 7)')
r['python_reads_a_script'] = subprocess.run(
    [sys.executable, 'script.py'], capture_output=True, text=True).stdout.strip()
print(json.dumps(r))
"""

# Memory amplification through the bridge: each is its own step.
BIG_VARIABLES = "\n".join(f"v{i} = 'x' * 2**24" for i in range(6))
BIG_BATCH = """
try:
    llm_query_batch([''] * 2_000_000)
    print('sent')
except Exception as e:
    print(type(e).__name__)
"""
EMPTY_OBJECTS_FRAME = """
import os, sys, struct
body = (b'{"op": "call", "id": 1, "step": 1, "name": "llm_query", "args": ['
        + b'{},' * 2_000_000 + b'{}], "kwargs": {}}')
os.write(int(sys.argv[1]), struct.pack('>cQ', b'J', len(body)) + body)
import time
time.sleep(10)
"""

ATTACKS = {
    "processes": PROCESSES,
    "syscalls": SYSCALLS,
    "network": NETWORK,
    "persistence": PERSISTENCE,
    "secrets": SECRETS,
    "limits": LIMITS,
    "newer": NEWER,
    "buffers": BUFFERS,
    "exec": EXEC,
}


# -- the driver: runs as a script, as root or as an unprivileged user --------------------
def _repl(code: str) -> str:
    return f"```repl\n{code.strip()}\n```"


def _maxrss_mb() -> float:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


async def _attack(victim: Path) -> dict:
    import site

    from llm_server import FakeLLMServer
    from session_forger import SESSION_FORGER

    from rlm_magic import RLM

    site.addsitedir(str(victim / "lib" / "site-packages"))  # the kernel's "venv"
    hits = _listen(victim / "runtime" / "kernel.sock")
    server = FakeLLMServer().start()
    try:
        rlm = RLM(
            model="openai/root-model",
            sub_model="openai/sub-model",
            api_base=server.base_url,
            api_key=FAKE_KEY,
            progress=False,
            timeout=10,
            retry_backoff=0.01,
            cache=True,
            cache_dir=str(victim / "cache"),
            sandbox="process",
            sandbox_disk_mb=16,
            sandbox_max_processes=32,
            step_timeout=30,
        )
        context = {
            "kernel_pid": os.getpid(),
            "home": str(victim / "home"),
            "notebook": str(victim / "notebook"),
            "site": str(victim / "lib" / "site-packages"),
            "runtime": str(victim / "runtime"),
            "cache": str(victim / "cache"),
            "tcp_port": hits["port"],
        }
        server.script("root-model", [_repl("print(llm_query('warm'))"), "FINAL(warm)"])
        # Each run asks its own question: the cache would answer a repeated root turn.
        await rlm.arun("warm up", context=context)  # litellm imported, the cache written

        out: dict = {}
        server.script("root-model", [*(_repl(code) for code in ATTACKS.values()), "FINAL(x)"])
        result = await rlm.arun("attack", context=context)
        out["failure"] = result.error
        steps = [run.output for it in result.trajectory for run in it.code]
        out.update({name: _parsed(text) for name, text in zip(ATTACKS, steps)})
        out["isolation"] = getattr(result, "isolation", None)  # (absent before issue 17)

        stalls: list[float] = []
        beating = asyncio.ensure_future(_heartbeat(stalls))
        before = _maxrss_mb()
        server.script("root-model", [_repl(BIG_VARIABLES), _repl(BIG_BATCH), "FINAL(x)"])
        flooded = await rlm.arun("flood", context="c")
        server.script("root-model", [_repl(EMPTY_OBJECTS_FRAME), "FINAL(x)"])
        framed = await rlm.arun("frame", context="c")
        beating.cancel()
        out["bridge"] = {
            "kernel_growth_mb": round(_maxrss_mb() - before, 1),
            "longest_stall_s": round(max(stalls, default=0.0), 3),
            "batch": [r.output for it in flooded.trajectory for r in it.code][1:2],
            "variables_chars": sum(len(str(v)) for v in flooded.variables.values()),
            "frame": [r.output for it in framed.trajectory for r in it.code][:1],
        }
        out["listeners_reached"] = hits["count"]
        out["wmem_default"] = int(Path("/proc/sys/net/core/wmem_default").read_text())
        session = rlm.session("poisoned")
        server.script(
            "root-model",
            [
                _repl(SESSION_FORGER),
                "FINAL(read)",
                _repl('FINAL(f"The honest answer is {sum(range(10))}")'),
            ],
        )
        await session.arun("Read the document", context="a poisoned document")
        honest = await session.arun("What is the sum of 0 to 9?", context="a harmless one")
        await session.aclose()
        out["session"] = {"success": honest.success, "answer": honest.final_answer}
        shared = Path(f"/dev/shm/rlm-attack-{os.getpid()}")
        out["host_dev_shm_written"] = shared.exists()
        shared.unlink(missing_ok=True)
        return out
    finally:
        server.stop()


def _parsed(text: str):
    try:
        return json.loads(text.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return text


async def _heartbeat(stalls: list[float]) -> None:
    while True:
        started = time.perf_counter()
        await asyncio.sleep(0.01)
        stalls.append(time.perf_counter() - started - 0.01)


def _listen(path: Path) -> dict:
    """A TCP listener on 127.0.0.1 and a Unix socket (as a kernel with IPC transport
    has): counts every connection made to either."""
    hits = {"count": 0}
    tcp = socket.create_server(("127.0.0.1", 0))
    unix = socket.socket(socket.AF_UNIX)
    unix.bind(str(path))
    unix.listen()
    hits["port"] = tcp.getsockname()[1]

    def serve(listener):
        while True:
            connection, _ = listener.accept()
            hits["count"] += 1
            connection.close()

    for listener in (tcp, unix):
        threading.Thread(target=serve, args=(listener,), daemon=True).start()
    return hits


# -- the tests --------------------------------------------------------------------------
try:
    import pytest
except ImportError:  # the driver needs no pytest
    pytest = None

UNPRIVILEGED_ID = 4242

if pytest is not None:
    # Two fresh interpreters attack for seconds (as root and as an ordinary user): the
    # slow tier, which CI runs.
    pytestmark = pytest.mark.slow
    _REPO = Path(__file__).resolve().parent.parent
    _outcomes: dict[str, dict] = {}

    def _victim(user: str) -> tuple[Path, list[str]]:
        """A folder with the package's copy, a fake home and the rest, owned by the
        user the attack runs as, and the command that runs it."""
        victim = Path(tempfile.mkdtemp(prefix="rlm-attack-"))
        victim.chmod(0o755)
        shutil.copytree(
            _REPO / "rlm_magic",
            victim / "rlm_magic",
            ignore=shutil.ignore_patterns("__pycache__", "kernel_spec"),
        )
        for support in ("llm_server.py", "session_forger.py"):  # what the driver imports
            shutil.copy(_REPO / "tests" / "support" / support, victim / support)
        shutil.copy(__file__, victim / "attack.py")
        home = victim / "home"
        (home / ".aws").mkdir(parents=True)
        (home / ".aws" / "credentials").write_text("aws_secret_access_key = fake-0007\n")
        (home / ".bashrc").write_text("# the user's\n")
        (home / ".ipython" / "profile_default" / "startup").mkdir(parents=True)
        (victim / "notebook").mkdir()
        (victim / "notebook" / ".env").write_text("API_TOKEN=fake-0008\n")
        (victim / "lib" / "site-packages").mkdir(parents=True)
        (victim / "runtime").mkdir()
        (victim / "runtime" / "kernel-1.json").write_text('{"key": "fake-0009"}')
        (victim / "cache").mkdir()
        command = [sys.executable, str(victim / "attack.py"), str(victim)]
        if user == "unprivileged":
            # An ordinary id: not 65534, the overflow id every id reads as inside a user
            # namespace before its maps are written (a sandbox mapping that id would
            # pass with the wrong one).
            ids = f"{UNPRIVILEGED_ID}:{UNPRIVILEGED_ID}"
            subprocess.run(["chown", "-R", ids, str(victim)], check=True)
            command = [
                "setpriv",
                f"--reuid={UNPRIVILEGED_ID}",
                f"--regid={UNPRIVILEGED_ID}",
                "--clear-groups",
                _interpreter_for_everyone(),
                *command[1:],
            ]
        return victim, command

    def _packages_for(user: str, victim: Path, command: list[str]) -> tuple[list, list]:
        """The command, and PYTHONPATH: this venv's packages (and PYTHONPATH's). A
        clone in a folder other users cannot enter (a 0700 `mktemp -d`, /root) holds a
        venv they cannot read either: then the packages are bound where they can, in a
        mount namespace of the attack's own (nothing on the host changes)."""
        import sysconfig

        packages = sorted(
            {
                sysconfig.get_paths()["purelib"],
                sysconfig.get_paths()["platlib"],
                # and those it was given (a system Python run with a venv's packages)
                *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep)),
            }
        )
        if user != "unprivileged" or all(_reachable(p) for p in packages):
            return command, packages
        binds, seen = [], []
        for number, path in enumerate(packages):
            target = victim / f"packages-{number}"
            target.mkdir()
            binds += [path, str(target)]
            seen.append(str(target))
        script = (
            'while [ $# -gt 0 ] && [ "$1" != -- ]; do mount --bind "$1" "$2" || exit 1; '
            'shift 2; done; shift; exec "$@"'
        )
        return (
            [
                "unshare",
                "--mount",
                "--propagation",
                "private",
                "sh",
                "-c",
                script,
                "sh",
                *binds,
                "--",
                *command,
            ],
            seen,
        )

    def _reachable(path: str) -> bool:
        """Whether any user may walk to ``path``."""
        return all(os.stat(folder).st_mode & 0o001 for folder in (Path(path), *Path(path).parents))

    def _interpreter_for_everyone() -> str:
        """This Python, or the same version elsewhere when this one lives where other
        users cannot go (a venv made from a Python under /root): with this venv's
        packages on PYTHONPATH, it runs the same code."""

        def usable(path: str) -> bool:
            parts = Path(os.path.realpath(path)).parents
            return os.stat(path).st_mode & 0o001 and all(
                os.stat(folder).st_mode & 0o001 for folder in parts
            )

        if usable(sys.executable):
            return sys.executable
        version = f"python{sys.version_info.major}.{sys.version_info.minor}"
        other = shutil.which(version, path="/usr/local/bin:/usr/bin:/bin")
        return other if other is not None and usable(other) else None

    def _run_attacks() -> None:
        users = (
            ["root", "unprivileged"]
            if os.geteuid() == 0 and shutil.which("setpriv")
            else ["this user"]
        )
        if "unprivileged" in users and _interpreter_for_everyone() is None:
            users.remove("unprivileged")  # no Python that user may run: skipped below
        started = {}
        for user in users:
            victim, command = _victim(user)
            command, packages = _packages_for(user, victim, command)
            env = {
                "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
                "HOME": str(victim / "home"),
                "LITELLM_LOCAL_MODEL_COST_MAP": "True",
                "PYTHONPATH": os.pathsep.join(packages),
                "LANG": "C.UTF-8",  # allowed
                "TERM": "xterm-256color",  # a terminal's: not the sandbox's
                "COLORTERM": "truecolor",
                **FAKE_ENV,
            }
            started[user] = (
                victim,
                subprocess.Popen(
                    command,
                    cwd=victim / "notebook",
                    env=env,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    text=True,
                ),
            )
        for user, (victim, process) in started.items():
            try:
                out, err = process.communicate(timeout=180)
            except subprocess.TimeoutExpired:
                process.kill()
                out, err = process.communicate()
            try:
                _outcomes[user] = json.loads(out.strip().splitlines()[-1])
            except (ValueError, IndexError):
                _outcomes[user] = {"failed": f"status {process.returncode}: {err[-3000:]}"}
            _outcomes[user]["files"] = _files(victim)
            shutil.rmtree(victim, ignore_errors=True)

    def _files(victim: Path) -> dict:
        worker = (victim / "rlm_magic" / "repl" / "worker.py").read_text()
        return {
            "bashrc": (victim / "home" / ".bashrc").read_text(),
            "startup": os.listdir(victim / "home" / ".ipython" / "profile_default" / "startup"),
            "site": os.listdir(victim / "lib" / "site-packages"),
            "worker_touched": "written by the model" in worker,
        }

    @pytest.fixture(scope="module", params=["root", "unprivileged"])
    def attacked(request):
        if not _outcomes:
            _run_attacks()
        if request.param not in _outcomes:
            if "this user" in _outcomes and request.param == "unprivileged":
                return _outcomes["this user"]
            pytest.skip("needs root (and setpriv) to run the attacks as another user too")
        outcome = _outcomes[request.param]
        assert "failed" not in outcome, outcome.get("failed")
        return outcome

    def test_every_isolation_layer_is_in_force(attacked):
        layers = attacked["isolation"]
        assert all(
            layers[name]
            for name in ("user", "pid", "filesystem", "network", "syscalls", "processes")
        ), layers

    def test_the_kernel_cannot_be_signalled_read_or_seen(attacked):
        assert attacked["processes"] == {
            "signal_kernel": "ProcessLookupError",
            "kernel_memory": "FileNotFoundError",
            "environments_with_the_key": 0,
        }

    def test_ptrace_namespaces_mounts_keyrings_and_new_sockets_are_refused(attacked):
        # A Unix socket is allowed inside the sandbox's own namespaces and filesystem
        # view, where it reaches only the sandbox's own (policy.UNIX_SOCKET_SYSCALLS).
        refused = {k: v for k, v in attacked["syscalls"].items() if k != "socket AF_UNIX"}
        assert attacked["syscalls"]["socket AF_UNIX"] == "ALLOWED"
        assert refused and all(v == "Operation not permitted" for v in refused.values()), refused

    def test_no_network_no_unix_socket_no_connection_file(attacked):
        assert attacked["network"] == {
            "tcp": "PermissionError",
            "unix_socket": "FileNotFoundError",  # the kernel's socket is not in its view
            "connection_file": "FileNotFoundError",
        }
        assert attacked["listeners_reached"] == 0

    def test_nothing_outside_the_working_folder_can_be_written(attacked):
        # Not there at all, or read-only (EROFS), or not the sandbox's (as root it is
        # "nobody", and the package belongs to root)
        assert set(attacked["persistence"].values()) <= {
            "FileNotFoundError",
            "OSError",
            "PermissionError",
        }, attacked["persistence"]
        files = attacked["files"]
        assert files == {
            "bashrc": "# the user's\n",
            "startup": [],
            "site": [],
            "worker_touched": False,
        }

    def test_no_secret_reaches_the_sandbox(attacked):
        assert attacked["secrets"] == {
            "variables": [],
            "fake_values": [],
            "aws_credentials": "FileNotFoundError",
            "dotenv": "FileNotFoundError",
            # Exactly the security guide's list (LANG is set for the kernel; TERM is too, and
            # stays out: model code has no terminal)
            "names": ["HOME", "LANG", "PATH", "TMPDIR"],
        }

    def test_a_syscall_newer_than_the_filters_tables_is_refused_as_unknown(attacked):
        assert attacked["newer"] == {
            "newest_plus_one": "Function not implemented",
            "far_newer": "Function not implemented",
        }

    def test_socket_and_pipe_buffers_are_held_to_the_fixed_allowance(attacked):
        buffers = attacked["buffers"]
        assert buffers["nofile"] == [256, 256] and buffers["raise_nofile"] == "ValueError"
        assert {buffers[name] for name in ("SO_SNDBUF", "SO_RCVBUF", "F_SETPIPE_SZ")} == {
            "PermissionError"
        }
        assert buffers["SO_SNDBUFFORCE"] == buffers["SO_RCVBUFFORCE"] == "PermissionError"
        # As many pairs as descriptors allow, each end filled to the default buffer:
        # the security guide's 64 MB per process (at the default net.core.wmem_default).
        assert buffers["pairs_stopped_by"] == "EMFILE" and 100 < buffers["pairs"] < 128
        assert buffers["queued"] <= 256 * 1.25 * attacked["wmem_default"]
        # In flight, the kernel refuses more once the user has 256 there (ETOOMANYREFS),
        # and one message carries at most 253: the security guide's second 256.
        assert buffers["in_flight_stopped_by"] == "ETOOMANYREFS"
        assert 256 <= buffers["in_flight"] <= 2 * 256

    def test_nothing_written_in_the_sandbox_runs_as_a_program(attacked):
        exec_ = attacked["exec"]
        assert exec_["script"] == exec_["program"] == "PermissionError"
        assert exec_["program_in_dev_shm"] == "PermissionError"
        # The loader can read the file but not map it executable
        assert exec_["program_through_the_loader"].startswith("status")
        assert exec_["system_program"] == "RAN"
        assert exec_["python_reads_a_script"] == "42"

    def test_processes_shared_memory_and_disk_are_limited(attacked):
        limits = attacked["limits"]
        assert limits["processes_started"] < 32 and limits["stopped_by"] == "BlockingIOError"
        assert limits["disk"] == "OSError"  # ENOSPC: the working folder is full
        assert limits["memfd"] == "PermissionError"  # memory no limit would count
        assert limits["sysv_shm"] == limits["sysv_queue"] == "Operation not permitted"
        assert limits["oob"] == "PermissionError"
        assert attacked["host_dev_shm_written"] is False  # its /dev/shm is its own

    def test_a_sessions_later_answer_cannot_be_forged_by_an_earlier_question(attacked):
        assert attacked["session"] == {"success": True, "answer": "The honest answer is 45"}

    def test_what_the_sandbox_sends_cannot_swell_or_stall_the_kernel(attacked):
        bridge = attacked["bridge"]
        assert bridge["batch"] == ["ValueError"]
        assert "broke the bridge protocol" in bridge["frame"][0]
        assert bridge["variables_chars"] < 2**20
        # Generous bounds for a loaded machine; the figures are in bench_sandbox.py.
        assert bridge["kernel_growth_mb"] < 100 and bridge["longest_stall_s"] < 1.0, bridge


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    print(json.dumps(asyncio.run(_attack(Path(sys.argv[1])))))
