"""Model code's process pools work in the sandbox whatever the start method, including
forkserver (Python 3.14's default on Linux), which listens on a Unix socket; and a
socket still reaches nothing outside: no network family, no Unix socket of the host's,
and where the OS refuses the sandbox's namespaces, no new socket at all."""

from __future__ import annotations

import json
import os
import shutil
import socket
import sys
import tempfile

import pytest

from rlm_magic.repl.isolation import linux, policy, seccomp_program, syscalls
from rlm_magic.repl.sandbox import SandboxREPL

from .support.sandboxed import NO_USER_NAMESPACES, filter_answer, sandboxed

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux layers")

# Each way model code may start a pool, the default last but one: forkserver forced as
# the default then, as on Python 3.14.
_POOLS = """
import concurrent.futures as cf, json, math, multiprocessing as mp
def pool(context):
    with context.Pool(2) as p:
        return p.map(math.sqrt, [1, 4, 9])
def executor(context=None):
    with cf.ProcessPoolExecutor(2, mp_context=context) as ex:
        return list(ex.map(math.sqrt, [1, 4, 9]))
ways = {
    'default': lambda: pool(mp),
    'fork': lambda: pool(mp.get_context('fork')),
    'spawn': lambda: pool(mp.get_context('spawn')),
    'forkserver': lambda: pool(mp.get_context('forkserver')),
    'executor': executor,
    'executor forkserver': lambda: executor(mp.get_context('forkserver')),
    'forced forkserver': lambda: (mp.set_start_method('forkserver', force=True), pool(mp))[1],
    'forced executor': executor,
}
out = {}
for name, way in ways.items():
    try:
        out[name] = way()
    except Exception as e:
        out[name] = f'{type(e).__name__}: {e}'
out['method'] = mp.get_start_method()
print(json.dumps(out))
"""


async def test_a_pool_runs_in_the_sandbox_under_every_start_method():
    repl = SandboxREPL("ctx", {})
    await repl.start()
    try:
        output = await repl.run(_POOLS)
    finally:
        await repl.aclose()
    assert repl.isolation["syscalls"] and repl.isolation["filesystem"], repl.isolation
    out = json.loads(output.as_text().splitlines()[-1])
    assert out.pop("method") == "forkserver"
    assert out == dict.fromkeys(out, [1.0, 2.0, 3.0]) and len(out) == 8


def _listeners(folder: str) -> tuple[list[socket.socket], str, str, int]:
    """What the test's own process serves: a Unix socket at a path, an abstract one and
    a TCP port on the loopback, each listening, none blocking."""
    path, name = os.path.join(folder, "host.sock"), f"\0rlm-test-{os.getpid()}"
    unix, abstract, tcp = (
        socket.socket(f) for f in (socket.AF_UNIX, socket.AF_UNIX, socket.AF_INET)
    )
    unix.bind(path)
    abstract.bind(name)
    tcp.bind(("127.0.0.1", 0))
    sockets = [unix, abstract, tcp]
    for listener in sockets:
        listener.listen()
        listener.setblocking(False)
    return sockets, path, name, tcp.getsockname()[1]


# What model code tries: the host's sockets, every network family, and (to tell a
# refusal from a broken Unix socket) a server and client of its own.
_REACH = """
import errno, json, os, socket
def attempt(f):
    try:
        f()
        return 'ALLOWED'
    except OSError as e:
        return errno.errorcode[e.errno]
def connect(family, address):
    with socket.socket(family) as s:
        s.settimeout(5)
        s.connect(address)
def own():
    with socket.socket(socket.AF_UNIX) as server, socket.socket(socket.AF_UNIX) as client:
        server.bind('own.sock'); server.listen()
        client.connect('own.sock'); client.sendall(b'ping')
        peer, _ = server.accept()
        assert peer.recv(4) == b'ping'
        peer.close()
out = {
    'host path': attempt(lambda: connect(socket.AF_UNIX, HOST_PATH)),
    'host abstract': attempt(lambda: connect(socket.AF_UNIX, HOST_NAME)),
    'tcp': attempt(lambda: connect(socket.AF_INET, ('127.0.0.1', PORT))),
    'inet6': attempt(lambda: socket.socket(socket.AF_INET6)),
    'netlink': attempt(lambda: socket.socket(socket.AF_NETLINK, socket.SOCK_RAW)),
    'packet': attempt(lambda: socket.socket(socket.AF_PACKET, socket.SOCK_RAW)),
    'inet pair': attempt(lambda: socket.socketpair(socket.AF_INET)),
    'own unix': attempt(own),
}
print(json.dumps(out))
"""


_ATTEMPTS = (
    "host path",
    "host abstract",
    "tcp",
    "inet6",
    "netlink",
    "packet",
    "inet pair",
    "own unix",
)


def _reach(path: str, name: str, port: int) -> str:
    return (
        _REACH.replace("HOST_PATH", repr(path))
        .replace("HOST_NAME", repr(name))
        .replace("PORT", str(port))
    )


def _nothing_reached(sockets: list[socket.socket]) -> None:
    for listener in sockets:
        with pytest.raises(BlockingIOError):
            listener.accept()


async def test_inside_its_namespaces_a_unix_socket_reaches_only_the_sandboxs_own():
    folder = tempfile.mkdtemp(prefix="rlm-")  # short: a socket's path has 108 bytes
    sockets, path, name, port = _listeners(folder)
    repl = SandboxREPL("ctx", {})
    await repl.start()
    try:
        output = await repl.run(_reach(path, name, port))
    finally:
        await repl.aclose()
        _nothing_reached(sockets)
        for listener in sockets:
            listener.close()
        shutil.rmtree(folder)
    assert repl.isolation["network"] and repl.isolation["filesystem"], repl.isolation
    assert json.loads(output.as_text().splitlines()[-1]) == {
        "host path": "ENOENT",  # not in its filesystem view
        "host abstract": "ECONNREFUSED",  # its network namespace has its own names
        "tcp": "EPERM",
        "inet6": "EPERM",
        "netlink": "EPERM",
        "packet": "EPERM",
        "inet pair": "EPERM",
        "own unix": "ALLOWED",
    }


@pytest.mark.skipif(linux.current_arch() is None, reason="no syscall table here")
def test_where_the_os_refuses_its_namespaces_no_socket_is_made_even_a_unix_one():
    folder = tempfile.mkdtemp(prefix="rlm-")
    sockets, path, name, port = _listeners(folder)
    try:
        out = sandboxed(_reach(path, name, port), before=NO_USER_NAMESPACES, timeout=90)
        _nothing_reached(sockets)
    finally:
        for listener in sockets:
            listener.close()
        shutil.rmtree(folder)
    assert not out["isolation"]["user"] and out["isolation"]["syscalls"]
    # The host's socket is in sight here (Landlock does not cover connecting to a path):
    # the filter refuses the socket itself.
    reached = json.loads(out["output"].splitlines()[-1])
    assert reached == dict.fromkeys(_ATTEMPTS, "EPERM")


@pytest.mark.parametrize("name", sorted(linux.ARCHES))
def test_the_filter_allows_unix_sockets_only_when_asked_and_never_another_family(name):
    arch = linux.ARCHES[name]
    with_unix = seccomp_program(arch, policy.ALLOWED_SYSCALLS + policy.UNIX_SOCKET_SYSCALLS)
    without = seccomp_program(arch)

    def answer(program: bytes, call: str, *args: int) -> int:
        return filter_answer(program, arch.table[call], args, arch.audit)

    assert not set(policy.UNIX_SOCKET_SYSCALLS) & set(policy.ALLOWED_SYSCALLS)
    assert not set(policy.UNIX_SOCKET_SYSCALLS) & set(policy.DENIED_SYSCALLS)
    for call in policy.UNIX_SOCKET_SYSCALLS:
        assert answer(without, call, 1, 1) == syscalls.EPERM, call
        assert answer(with_unix, call, 1, 1) == syscalls.ALLOW, call
    # Every family but AF_UNIX (1): AF_INET, AF_INET6, AF_NETLINK, AF_PACKET, AF_VSOCK...
    for family in (0, 2, 10, 16, 17, 40, 44, 0x101):
        assert answer(with_unix, "socket", family, 1) == syscalls.EPERM, family
        assert answer(with_unix, "socketpair", family, 1) == syscalls.EPERM, family
