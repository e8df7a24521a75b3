"""How much host memory one sandboxed process can pin in socket and pipe buffers: the
figure behind the per-process allowance in docs/guides/security.md.

Run from the repo root (Linux):  python benchmarks/bench_pinned_memory.py [--reps 3]
                                 [--repo PATH]  (another checkout's rlm_magic, to compare)

Model code in a real sandbox (every layer on) opens as many socket pairs as it may
(RLIMIT_NOFILE), fills both directions of each until the kernel says EAGAIN, then
(second case) does the same with pipes, and (third case) passes filled socket pairs
over one carrier with SCM_RIGHTS and closes its own copies, until refused, so that the
buffers are held only in flight. A helper call lets the kernel read the host's
MemAvailable while the code holds them, and another just after it let them go: the
difference, about a second apart (so that the rest of a shared machine moves it
little), is what the process pinned, roughly (the rest of the machine moves it by tens of
MB). The figure that holds is ``charged_mb``: the bytes the kernel charges the
process's sockets for (SIOCOUTQ, each skb's true size) and its pipes' pages. Each case
is its own sandbox.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

FILL = r"""
import os, socket, resource, errno, fcntl, struct
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
held, queued, charged, refused = [], 0, 0, []
def fill(sock, count=True):
    # Fill one socket; returns (bytes sent, bytes the kernel charges it: SIOCOUTQ,
    # the true size of its skbs in flight), added to the totals if count.
    global queued, charged
    sock.setblocking(False)
    sent = 0
    for size in (65536, 4096, 1):
        while True:
            try:
                sent += sock.send(b'x' * size)
            except (BlockingIOError, OSError):
                break
    outq = struct.unpack('i', fcntl.ioctl(sock, 0x5411, b'\0' * 4))[0]
    if count:
        queued, charged = queued + sent, charged + outq
    return sent, outq
options = dict(SO_SNDBUF=7, SO_RCVBUF=8, SO_SNDBUFFORCE=32, SO_RCVBUFFORCE=33)
for opt, number in options.items():
    a, b = socket.socketpair()
    try:
        a.setsockopt(socket.SOL_SOCKET, number, 64 * 2**20)
    except OSError as e:
        refused.append(opt)
    a.close(); b.close()
CASE
llm_query('held')
for item in held:
    for end in (item if isinstance(item, tuple) else ()):
        os.close(end) if isinstance(end, int) else end.close()
held_count = len(held)
del held[:]
llm_query('released')
print(dict(nofile=soft, held=held_count, queued_mb=round(queued / 2**20, 1),
           charged_mb=round(charged / 2**20, 1), refused=sorted(set(refused))))
"""

CASES = {
    "socket pairs": """
while True:
    try:
        a, b = socket.socketpair()
    except OSError:
        break
    held.append((a, b)); fill(a); fill(b)
""",
    "pipes": """
while True:
    try:
        r, w = os.pipe()
    except OSError:
        break
    try:
        fcntl.fcntl(w, 1031, 2**20)  # F_SETPIPE_SZ
    except OSError:
        refused.append('F_SETPIPE_SZ')
    os.set_blocking(w, False)
    held.append((r, w))
    written = 0
    for size in (65536, 4096, 1):
        while True:
            try:
                written += os.write(w, b'x' * size)
            except BlockingIOError:
                break
    queued += written
    charged += -(-written // 4096) * 4096  # whole pages
""",
    "socket pairs in flight (SCM_RIGHTS)": """
carrier, far = socket.socketpair()
carrier.setblocking(False)
in_flight, why = 0, None
while why is None:
    batch, filled = [], []  # as many filled pairs as may be open, in one message (<= 253)
    try:
        while len(batch) < 250:
            a, b = socket.socketpair()
            filled += (fill(a, False), fill(b, False))
            batch += (a, b)
    except OSError:
        pass
    try:
        socket.send_fds(carrier, [b'x'], [end.fileno() for end in batch])
        in_flight += len(batch)
        queued += sum(sent for sent, _ in filled)
        charged += sum(outq for _, outq in filled)
    except OSError as e:
        why = errno.errorcode[e.errno]
    for end in batch:
        end.close()
held.append((carrier, far))
print('in flight', in_flight, 'stopped by', why)
""",
}
# All at once: the most in flight, then the most held open.
CASES["both"] = CASES["socket pairs in flight (SCM_RIGHTS)"] + CASES["socket pairs"]


async def _available_mb() -> float:
    """MemAvailable, its per-CPU counters folded first (as root: vm.stat_refresh), else
    after the kernel's one-second fold."""
    try:
        Path("/proc/sys/vm/stat_refresh").write_text("1")
    except OSError:
        await asyncio.sleep(1.5)
    with open("/proc/meminfo") as file:
        for line in file:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError("no MemAvailable")


async def pinned(case: str) -> tuple[float, str]:
    from rlm_magic.repl.sandbox import SandboxREPL

    seen: dict[str, float] = {}

    async def measure(prompt, **_):
        seen[prompt] = await _available_mb()
        return "ok"

    repl = SandboxREPL("c", {"llm_query": measure})
    await repl.start()
    await repl._ready()
    output = await repl.run(FILL.replace("CASE", CASES[case]), timeout=120)
    await repl.aclose()
    pinned = seen["released"] - seen["held"] if len(seen) == 2 else float("nan")
    return pinned, output.as_text().strip()


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--repo", default=str(ROOT), help="the checkout whose rlm_magic runs")
    parser.add_argument("--cases", nargs="*", default=list(CASES), choices=list(CASES))
    args = parser.parse_args()
    sys.path.insert(0, args.repo)
    print(f"rlm_magic from {args.repo}; net.core.wmem_default =", _read("net/core/wmem_default"))
    print("| case | host MemAvailable held (noisy), median (min-max) | what the code saw |")
    print("|---|---|---|")
    for case in args.cases:
        figures, last = [], ""
        for _ in range(args.reps):
            mb, last = await pinned(case)
            figures.append(mb)
        span = f"{statistics.median(figures):.0f} MB ({min(figures):.0f}-{max(figures):.0f})"
        print(f"| {case} | {span} | {' '.join(last.split())[:160]} |")


def _read(name: str) -> str:
    try:
        return Path("/proc/sys", name).read_text().strip()
    except OSError:
        return "?"


if __name__ == "__main__":
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    asyncio.run(main())
