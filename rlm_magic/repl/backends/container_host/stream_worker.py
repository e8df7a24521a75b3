"""The container sandbox's worker: ``repl/worker.py``'s ``Worker`` (real threads, a
reader thread as in the process sandbox), its bridge over the container's stdin and
stdout.

It arrives in the first frame (``container.BOOT`` reads it and calls ``run``) with the
REPL's shared modules, which it imports from memory: the package's folder is never
mounted. ``run`` forks: pid 1 stays a small supervisor that reaps orphans and, when the
worker dies, says on stderr how (the memory cgroup's OOM kills are told apart from
other deaths), and the child is the worker. The container is the isolation: the worker
applies no layer of its own; it checks the container's from inside and reports them.

Model code runs as pid 1's uid, so pid 1 keeps what it says out of model code's reach:
it is not dumpable (its ``/proc/1`` files, descriptors and memory are closed to that
uid, and it cannot be traced), it ignores SIGINT (an orphan's storm cannot stop its
last line), and its exit line carries a token of this launch it reads from the bridge
after the fork, so the worker's memory never holds it (``container.how_it_ended``).

Runs inside the container only (Python 3.11 of the image, standard library only).
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import json
import os
import signal
import sys
import threading
from collections.abc import Callable
from types import ModuleType
from typing import Any

# What pid 1 writes on stderr when the worker is gone, with its token and how
# (container.how_it_ended reads it).
EXIT_MARK = "rlm-sandbox exit:"
_PR_SET_DUMPABLE = 4  # prctl(2)
# The environment the kernel gives (container.launch) and what the runtime and Python
# add; a proxy variable the docker client would add is overridden empty.
_ENVIRONMENT = {"PATH", "HOME", "TMPDIR", "LANG", "LC_CTYPE", "HOSTNAME", "TERM", "container"}
_CGROUP = "/sys/fs/cgroup"


class _FromMemory(importlib.abc.MetaPathFinder, importlib.abc.InspectLoader):
    """Imports ``rlm_magic.*`` from the sources the kernel sent."""

    def __init__(self, files: dict[str, str]):
        self.sources: dict[str, tuple[str, str]] = {}  # module -> (path, source)
        for path, source in files.items():
            name = path[: -len(".py")].replace("/", ".")
            self.sources[name.removesuffix(".__init__")] = ("/rlm/" + path, source)
        for package in ("rlm_magic", "rlm_magic.repl"):
            self.sources.setdefault(package, (f"/rlm/{package.replace('.', '/')}/__init__.py", ""))

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        if name not in self.sources:
            return None
        origin = self.sources[name][0]
        spec = importlib.util.spec_from_loader(
            name, self, origin=origin, is_package=origin.endswith("__init__.py")
        )
        if spec is not None:
            spec.has_location = True  # __file__: worker.py finds its package by it
        return spec

    def get_source(self, fullname: str) -> str:
        return self.sources[fullname][1]

    def exec_module(self, module: ModuleType) -> None:
        path, source = self.sources[module.__name__]
        exec(compile(source, path, "exec"), module.__dict__)  # noqa: S102 - the kernel's code


def run(files: dict[str, str]) -> None:
    """pid 1's part: fork the worker, read this launch's token, reap every process, and
    say how the worker ended under the token."""
    counted = _oom_kills()
    _dumpable(False)  # before the fork: closed to model code's uid from its start
    go, went = os.pipe()
    child = os.fork()
    if child == 0:
        os.close(went)
        os.read(go, 1)  # until pid 1 has read its token off the bridge (or is gone)
        os.close(go)
        _dumpable(True)  # its own /proc/self again (oom_score_adj, status)
        try:
            _be_the_worker(files)
        except BaseException:  # noqa: BLE001 - said on stderr (the kernel quotes it)
            import traceback

            traceback.print_exc(limit=-1)
        os._exit(1)
    # The kernel's interrupts are the worker's (in band); an orphan's storm of SIGINT
    # cannot stop pid 1 before its last line.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    os.close(go)
    try:
        token = str(json.loads(_read_frame(0))["token"])
    except (EOFError, OSError, ValueError, KeyError, TypeError):
        os._exit(1)  # the kernel is gone, or sent something else: no worker to watch
    os.close(went)  # the worker goes on; the bridge is its alone
    null = os.open(os.devnull, os.O_RDWR)
    os.dup2(null, 0)
    os.dup2(null, 1)
    while True:
        try:
            pid, status = os.wait()
        except ChildProcessError:
            os._exit(1)
        if pid == child:
            break
    if os.WIFSIGNALED(status):
        killed = os.WTERMSIG(status)
        how = "oom" if _oom_kills() > counted else f"signal {killed}"
        code = 128 + killed
    else:
        code = os.WEXITSTATUS(status)
        how = f"status {code}"
    os.write(2, f"\n{EXIT_MARK} {token} {how}\n".encode())
    os._exit(code)


def _dumpable(dumpable: bool) -> None:
    """prctl(PR_SET_DUMPABLE): a process that is not dumpable has its /proc files owned
    by root and cannot be traced or read by its uid's other processes."""
    try:
        import ctypes

        ctypes.CDLL(None).prctl(_PR_SET_DUMPABLE, int(dumpable), 0, 0, 0)
    except (ImportError, OSError, AttributeError):
        pass  # the token still holds where the memory cannot be read (Yama)


def _read_frame(fd: int) -> bytearray:
    """One frame's body off ``fd`` (a 9-byte header: its kind, its length)."""
    header = _exactly(fd, 9)
    return _exactly(fd, int.from_bytes(header[1:], "big"))


def _exactly(fd: int, size: int) -> bytearray:
    data = bytearray()
    while len(data) < size:
        chunk = os.read(fd, min(size - len(data), 2**20))
        if not chunk:
            raise EOFError("the kernel closed the bridge")
        data += chunk
    return data


def _oom_kills() -> int:
    """How many processes the container's memory limit has killed (cgroup v2, else v1)."""
    for path, key in (
        (f"{_CGROUP}/memory.events", "oom_kill"),
        (f"{_CGROUP}/memory/memory.oom_control", "oom_kill"),
    ):
        try:
            with open(path) as file:
                for line in file:
                    name, _, value = line.partition(" ")
                    if name == key:
                        return int(value)
        except (OSError, ValueError):
            continue
    return 0


def _be_the_worker(files: dict[str, str]) -> None:
    try:  # the memory limit takes the worker (and what it starts), not pid 1
        with open("/proc/self/oom_score_adj", "w") as file:
            file.write("1000")
    except OSError:
        pass
    sys.meta_path.insert(0, _FromMemory(files))
    from rlm_magic.repl import bridge
    from rlm_magic.repl import worker as process_worker
    from rlm_magic.repl.capture import routing_installed

    # The bridge on descriptors of its own, which no program model code runs inherits;
    # 0 and 1 go nowhere (a stray write cannot break a frame), and 2 once started.
    bridge_in, bridge_out = os.dup(0), os.dup(1)
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1):
        os.dup2(null, fd)
    worker = _stream_worker(process_worker)(bridge_in, bridge_out)
    try:
        worker.start()
    except (EOFError, OSError, bridge.BridgeError):
        os._exit(1)
    os.dup2(null, 2)  # started: anything said from now on is model code's
    signal.signal(signal.SIGINT, process_worker._on_sigint(worker))
    threading.Thread(target=worker.read_forever, name="rlm-bridge", daemon=True).start()
    with routing_installed():
        worker.serve()
    os._exit(0)


def _stream_worker(process_worker: ModuleType) -> Any:
    """The process worker over two pipes (a class made once its module is imported)."""
    from rlm_magic.repl import bridge

    class StreamWorker(process_worker.Worker):  # type: ignore[name-defined,misc]
        def __init__(self, bridge_in: int, bridge_out: int):
            super().__init__(None)
            self.bridge_in, self.bridge_out = bridge_in, bridge_out

        def send_bytes(self, data: bytes) -> None:
            with self.send_lock:
                view = memoryview(data)
                while view:
                    view = view[os.write(self.bridge_out, view) :]

        def read_exactly(self, size: int) -> bytearray:
            return _exactly(self.bridge_in, size)

        def receive(self) -> tuple[bytes, bytes | bytearray]:
            while True:
                header = bytes(self.read_exactly(bridge.HEADER.size))
                if header[:1] != bridge.INTERRUPT_KIND:
                    break
                _interrupt_main()  # the kernel's SIGINT, in band
            kind, length = bridge.parse_header(
                header, limit=None, kinds=(bridge.JSON, bridge.PICKLE, bridge.DATA)
            )
            return kind, self.read_exactly(length)

        def confine(self, init: dict[str, Any]) -> dict[str, Any]:
            """Nothing to apply: the container is the isolation. Each layer is checked
            from inside, so the report says what holds, not what was asked for."""
            return container_report(init.get("container") or {})

        def stop_after(self, seconds: float) -> Callable[[], None]:
            timer = threading.Timer(seconds, _interrupt_main)
            timer.daemon = True
            timer.start()
            return timer.cancel

    return StreamWorker


def _interrupt_main() -> None:
    """SIGINT to the main thread itself: it ends a blocking wait there (a sleep, a
    helper call's answer), as the process sandbox's SIGINT does."""
    signal.pthread_kill(threading.main_thread().ident or 0, signal.SIGINT)


def container_report(asked: dict[str, Any]) -> dict[str, Any]:
    """Each layer of the container as seen from inside, against what the kernel asked."""
    layers: dict[str, bool] = {}
    notes: dict[str, str] = {}

    def check(layer: str, holds: bool, note: str, otherwise: str) -> None:
        layers[layer] = holds
        notes[layer] = note if holds else otherwise

    runtime = str(asked.get("runtime", "container"))
    check(
        "container",
        _first_line("/proc/1/cmdline").startswith("python3") and os.getpid() != 1,
        f"a {runtime} container of its own (mount, PID, IPC and UTS namespaces)",
        "pid 1 is not the sandbox's own: not a PID namespace of its own",
    )
    read_only = bool(os.statvfs("/").f_flag & os.ST_RDONLY)
    check(
        "filesystem",
        read_only and os.access("/tmp", os.W_OK),
        f"the image's read-only root, none of the kernel's files; /tmp a "
        f"{asked.get('disk_mb')} MB tmpfs of its own",
        "the root is writable" if not read_only else "/tmp is not writable",
    )
    interfaces = sorted(os.listdir("/sys/class/net")) if os.path.isdir("/sys/class/net") else []
    check(
        "network",
        interfaces == ["lo"],
        "no network: loopback only (--network=none)",
        f"network interfaces {', '.join(interfaces) or 'unknown'}",
    )
    extra = sorted(n for n, v in os.environ.items() if n not in _ENVIRONMENT and v)
    check(
        "environment",
        not extra,
        "none of the kernel's environment: PATH, HOME, TMPDIR and LANG of its own",
        f"variables it was not given: {', '.join(extra)[:200]}",
    )
    status = _status()
    unprivileged = (
        os.getuid() != 0
        and os.geteuid() != 0
        and int(status.get("CapEff", "1"), 16) == 0
        and status.get("NoNewPrivs") == "1"
    )
    check(
        "user",
        unprivileged,
        f"uid {os.getuid()}, no capabilities, no new privileges",
        f"uid {os.geteuid()}, capabilities {status.get('CapEff')}, "
        f"no_new_privs {status.get('NoNewPrivs')}",
    )
    pids = _cgroup_value("pids.max", "pids/pids.max")
    check(
        "processes",
        pids == asked.get("max_processes"),
        f"at most {pids} processes and threads (pids cgroup)",
        f"the pids cgroup allows {pids if pids is not None else 'any number'}",
    )
    memory = _cgroup_value("memory.max", "memory/memory.limit_in_bytes")
    asked_mb = asked.get("memory_mb")
    check(
        "memory",
        asked_mb is not None and memory == asked_mb * 2**20,
        f"{asked_mb} MB for all its processes, no swap (memory cgroup: past it, killed)",
        "no memory limit (RLM.sandbox_memory_mb is None)"
        if asked_mb is None
        else f"the memory cgroup's limit is {memory}, not {asked_mb} MB",
    )
    return {"layers": layers, "notes": notes}


def _first_line(path: str) -> str:
    try:
        with open(path, "rb") as file:
            return file.read(200).replace(b"\0", b" ").decode("utf-8", "replace")
    except OSError:
        return ""


def _status() -> dict[str, str]:
    fields = {}
    with open("/proc/self/status") as file:
        for line in file:
            name, _, value = line.partition(":")
            fields[name] = value.strip()
    return fields


def _cgroup_value(v2: str, v1: str) -> int | None:
    """A limit of the container's cgroup (None: none, or none found)."""
    for path in (f"{_CGROUP}/{v2}", f"{_CGROUP}/{v1}"):
        try:
            with open(path) as file:
                text = file.read().strip()
        except OSError:
            continue
        return None if text == "max" else int(text)
    return None
