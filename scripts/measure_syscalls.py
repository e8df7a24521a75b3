# ruff: noqa: E501 - the workload is model code, written as a model would
"""Which syscalls sandboxed model code makes: the measurement behind the syscall
filter's allow-list (``ALLOWED_SYSCALLS`` in rlm_magic/repl/isolation/policy.py).

Run from the repo root (Linux, with strace):

    python scripts/measure_syscalls.py [--show-all]

It starts a real sandbox (``SandboxREPL``, every isolation layer on) whose worker runs
under ``strace -f``, runs a workload of ordinary model code in it (files, subprocess
and the usual command-line tools, threads, asyncio, multiprocessing, signals, mmap,
select/poll/epoll, sqlite3, compression, ctypes, numpy, pandas and matplotlib where
installed, the helpers over the bridge), and reads the trace: every syscall made by
the worker and by what it started *after* the filter was applied (the confinement's
own calls before it are left out). It prints each syscall with its count and whether
the allow-list has it, then what was refused (EPERM/ENOSYS) and any step that failed.

Exit status 0 when every syscall the workload made is allowed and no step failed; 1
otherwise. Run it with the Python whose packages the sandbox should serve (numpy,
pandas... where they are installed), once as root and once as an ordinary user.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from rlm_magic.repl import isolation  # noqa: E402
from rlm_magic.repl.isolation.linux import current_arch  # noqa: E402
from rlm_magic.repl.isolation.policy import ALLOWED_SYSCALLS  # noqa: E402
from rlm_magic.repl.sandbox import SandboxREPL  # noqa: E402
from rlm_magic.repl.sandbox import process as sandbox_process  # noqa: E402

# -- the workload: each block is one step of model code ----------------------------------
WORKLOAD = {
    "files": r"""
import os, shutil, pathlib, tempfile, glob, json, csv, io, stat, fcntl
os.makedirs('d/e', exist_ok=True)
with open('d/a.txt', 'w') as f:
    f.write('hello\n' * 1000)
with open('d/a.txt') as f:
    f.seek(10); f.read(); f.tell()
with open('d/a.txt', 'r+b') as f:
    os.pread(f.fileno(), 10, 0); os.pwrite(f.fileno(), b'x', 0)
    os.fsync(f.fileno()); os.fdatasync(f.fileno()); os.lseek(f.fileno(), 0, 2)
    fcntl.flock(f, fcntl.LOCK_EX); fcntl.flock(f, fcntl.LOCK_UN)
    fcntl.lockf(f, fcntl.LOCK_EX); fcntl.lockf(f, fcntl.LOCK_UN)
    os.posix_fallocate(f.fileno(), 0, 8192); os.posix_fadvise(f.fileno(), 0, 0, 0)
    os.ftruncate(f.fileno(), 4096); os.fstat(f.fileno()); os.fstatvfs(f.fileno())
    os.readv(f.fileno(), [bytearray(4)]); os.writev(f.fileno(), [b'ab', b'cd'])
    os.preadv(f.fileno(), [bytearray(4)], 0); os.pwritev(f.fileno(), [b'ab'], 0)
os.truncate('d/a.txt', 100)
shutil.copy('d/a.txt', 'd/b.txt'); shutil.copy2('d/a.txt', 'd/c.txt')
shutil.copytree('d', 'd2'); shutil.move('d2', 'd3'); shutil.rmtree('d3')
os.rename('d/b.txt', 'd/b2.txt'); os.replace('d/b2.txt', 'd/b3.txt')
os.link('d/a.txt', 'd/hard'); os.symlink('a.txt', 'd/soft'); os.readlink('d/soft')
os.chmod('d/a.txt', 0o600); os.chmod('d/soft', 0o644, follow_symlinks=False) if os.chmod in os.supports_follow_symlinks else None
os.utime('d/a.txt'); os.utime('d/a.txt', (1, 2)); os.access('d/a.txt', os.R_OK)
os.stat('d/a.txt'); os.lstat('d/soft'); os.path.exists('nope'); os.path.realpath('d/soft')
list(os.scandir('d')); list(os.walk('.')); glob.glob('**/*.txt', recursive=True)
sorted(pathlib.Path('.').rglob('*')); pathlib.Path('p.txt').write_text('x'); pathlib.Path('p.txt').read_text()
os.statvfs('.'); shutil.disk_usage('.'); os.getcwd(); os.chdir('d'); os.chdir('..')
fd, name = tempfile.mkstemp(); os.write(fd, b'x'); os.close(fd); os.unlink(name)
with tempfile.TemporaryDirectory() as t:
    open(os.path.join(t, 'x'), 'w').close()
with tempfile.SpooledTemporaryFile(max_size=10) as t:
    t.write(b'x' * 100); t.seek(0); t.read()
with tempfile.NamedTemporaryFile() as t:
    t.write(b'y')
with open('t.csv', 'w', newline='') as f:
    csv.writer(f).writerows([[1, 2], [3, 4]])
list(csv.reader(open('t.csv')))
json.dump({'a': 1}, open('t.json', 'w')); json.load(open('t.json'))
src = os.open('d/a.txt', os.O_RDONLY); dst = os.open('d/sent', os.O_WRONLY | os.O_CREAT)
os.sendfile(dst, src, 0, 50)
if hasattr(os, 'copy_file_range'):
    os.copy_file_range(src, dst, 10, 0)
os.close(src); os.close(dst)
fd = os.open('.', os.O_RDONLY | os.O_DIRECTORY); os.listdir(fd); os.stat('d', dir_fd=fd); os.close(fd)
os.mkfifo('fifo'); os.unlink('fifo'); os.umask(0o22)
os.listxattr('d/a.txt') if hasattr(os, 'listxattr') else None
os.remove('d/hard'); os.rmdir('d/e')
print('ok')
""",
    "archives": r"""
import zipfile, tarfile, gzip, bz2, lzma, shutil, zlib, os
os.makedirs('arc', exist_ok=True)
open('arc/x.txt', 'w').write('data ' * 1000)
with zipfile.ZipFile('a.zip', 'w', zipfile.ZIP_DEFLATED) as z:
    z.write('arc/x.txt')
zipfile.ZipFile('a.zip').extractall('unz')
with tarfile.open('a.tar.gz', 'w:gz') as t:
    t.add('arc')
tarfile.open('a.tar.gz').extractall('untar')
for mod, ext in ((gzip, 'gz'), (bz2, 'bz2'), (lzma, 'xz')):
    with mod.open('x.' + ext, 'wb') as f:
        f.write(b'z' * 10000)
    mod.open('x.' + ext).read()
shutil.make_archive('made', 'zip', 'arc'); shutil.unpack_archive('made.zip', 'unmade')
zlib.compress(b'a' * 1000)
print('ok')
""",
    "sqlite": r"""
import sqlite3
for mode in ('delete', 'wal'):
    db = sqlite3.connect(f'db-{mode}.sqlite3')
    db.execute(f'pragma journal_mode={mode}')
    db.execute('create table if not exists t (a, b)')
    db.executemany('insert into t values (?, ?)', [(i, str(i)) for i in range(1000)])
    db.commit()
    db.execute('select count(*), sum(a) from t group by b % 7').fetchall()
    db.close()
m = sqlite3.connect(':memory:'); m.execute('select 1'); m.close()
print('ok')
""",
    "subprocess_and_tools": r"""
import subprocess, os, shutil, sys, signal
run = lambda *a, **k: subprocess.run(*a, capture_output=True, text=True, timeout=30, **k)
open('in.txt', 'w').write('b 2\na 1\nc 3\na 1\n')
out = []
for cmd in (['ls', '-la'], ['cat', 'in.txt'], ['grep', '-n', 'a', 'in.txt'], ['sed', 's/a/A/', 'in.txt'],
            ['awk', '{s+=$2} END {print s}', 'in.txt'], ['sort', '-k2n', 'in.txt'], ['uniq', '-c', 'in.txt'],
            ['wc', '-l', 'in.txt'], ['head', '-2', 'in.txt'], ['tail', '-1', 'in.txt'], ['cut', '-d', ' ', '-f1', 'in.txt'],
            ['tr', 'a-z', 'A-Z'], ['find', '.', '-name', '*.txt'], ['du', '-sh', '.'], ['df', '-h', '.'],
            ['date'], ['env'], ['id'], ['uname', '-a'], ['nproc'], ['md5sum', 'in.txt'], ['sha256sum', 'in.txt'],
            ['base64', 'in.txt'], ['stat', 'in.txt'], ['file', 'in.txt'], ['diff', 'in.txt', 'in.txt'],
            ['cp', 'in.txt', 'in2.txt'], ['mv', 'in2.txt', 'in3.txt'], ['ln', '-s', 'in3.txt', 'l'], ['rm', 'l', 'in3.txt'],
            ['mkdir', '-p', 'q/r'], ['touch', 'q/r/s'], ['chmod', '600', 'q/r/s'], ['tar', 'czf', 'q.tgz', 'q'],
            ['tar', 'xzf', 'q.tgz', '-C', 'q/r'], ['gzip', '-k', 'in.txt'], ['xz', '-k', 'in.txt'], ['bzip2', '-k', 'in.txt'],
            ['zip', '-q', 'q.zip', 'in.txt'], ['unzip', '-o', '-q', 'q.zip', '-d', 'uz'], ['seq', '5'], ['realpath', 'in.txt'],
            ['jq', '.', '/dev/null'], ['ps', 'aux'], ['free', '-m'], ['perl', '-e', 'print 1+1'], ['sqlite3', ':memory:', 'select 1'],
            ['git', 'init', '-q', 'repo'], ['git', '-C', 'repo', 'status'], ['timeout', '5', 'true'],
            ['sh', '-c', 'echo hi | wc -c; ls | sort | head -1 > o.txt; cat o.txt'],
            ['bash', '-c', 'for i in 1 2 3; do echo $i; done | xargs echo; (sleep 0.01 &); wait'],
            [sys.executable, '-c', 'import os, json; print(json.dumps(os.listdir()))']):
    if shutil.which(cmd[0]):
        p = run(cmd, input='abc\n' if cmd[0] == 'tr' else None)
        out.append((cmd[0], p.returncode))
p = subprocess.Popen(['cat'], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
p.communicate(b'x' * 100000, timeout=10)
p = subprocess.Popen(['sleep', '10']); p.terminate(); p.wait()
p = subprocess.Popen(['sleep', '10'], start_new_session=True); os.killpg(p.pid, signal.SIGKILL); p.wait()
try:
    subprocess.run(['sleep', '10'], timeout=0.2)
except subprocess.TimeoutExpired:
    pass
subprocess.check_output('echo $HOME', shell=True); os.system('true')
with os.popen('ls') as f:
    f.read()
pid = os.fork()
if pid == 0:
    os._exit(3)
os.waitpid(pid, 0)
pid = os.fork()
if pid == 0:
    os.execv('/bin/true', ['true'])
os.wait4(pid, 0)
if hasattr(os, 'posix_spawn'):
    os.waitpid(os.posix_spawn('/bin/true', ['true'], os.environ), 0)
r, w = os.pipe(); os.set_blocking(r, False); os.write(w, b'x'); os.read(r, 1); os.close(r); os.close(w)
r, w = os.pipe2(os.O_CLOEXEC); os.dup2(w, 100); os.dup(r); os.close(100)
print([c for c, code in out if code != 0])
""",
    "scripts_in_the_working_folder": r"""
import subprocess, sys
open('script.py', 'w').write('import sys; print(sys.argv[1:])')
print(subprocess.run([sys.executable, 'script.py', 'a'], capture_output=True, text=True).stdout.strip())
open('script.sh', 'w').write('echo from sh')
print(subprocess.run(['sh', 'script.sh'], capture_output=True, text=True).stdout.strip())
""",
    "threads": r"""
import threading, queue, concurrent.futures, time
q, lock, cond, ev = queue.Queue(), threading.Lock(), threading.Condition(), threading.Event()
def work(i):
    with lock:
        q.put(i)
    ev.wait(0.01)
    return i * i
threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
for t in threads: t.start()
for t in threads: t.join()
with concurrent.futures.ThreadPoolExecutor(8) as pool:
    print(sum(pool.map(work, range(100))))
b = threading.Barrier(2); t = threading.Thread(target=b.wait); t.start(); b.wait(); t.join()
timer = threading.Timer(0.01, ev.set); timer.start(); timer.join()
with cond:
    cond.wait(0.01)
local = threading.local(); local.x = 1
threading.stack_size(); threading.get_native_id()
""",
    "asyncio": r"""
import asyncio, sys, os
async def main():
    await asyncio.gather(*(asyncio.sleep(0.01) for _ in range(10)))
    await asyncio.to_thread(sum, range(100))
    p = await asyncio.create_subprocess_exec('echo', 'hi', stdout=asyncio.subprocess.PIPE)
    out, _ = await p.communicate()
    p = await asyncio.create_subprocess_shell('sleep 5')
    p.kill(); await p.wait()
    r, w = os.pipe()
    reader = asyncio.StreamReader(); proto = asyncio.StreamReaderProtocol(reader)
    await asyncio.get_running_loop().connect_read_pipe(lambda: proto, os.fdopen(r, 'rb'))
    os.write(w, b'line\n'); await reader.readline(); os.close(w)
    try:
        await asyncio.wait_for(asyncio.sleep(10), 0.01)
    except asyncio.TimeoutError:
        pass
    answers = await asyncio.gather(*(llm_query_async(f'q{i}') for i in range(3))) if 'llm_query_async' in globals() else []
    return out, answers
print(asyncio.run(main()))
""",
    "multiprocessing": r"""
import multiprocessing, concurrent.futures, os
# (functions the model defines cannot be pickled by reference: builtins can)
with multiprocessing.Pool(2) as pool:
    print(sum(pool.map(abs, range(100))))
with concurrent.futures.ProcessPoolExecutor(2) as pool:
    print(sum(pool.map(abs, range(10))))
q = multiprocessing.Queue(); p = multiprocessing.Process(target=q.put, args=(1,)); p.start(); q.get(); p.join()
lock = multiprocessing.Lock()
with lock:
    pass
v = multiprocessing.Value('i', 3); a = multiprocessing.Array('d', 10)
ctx = multiprocessing.get_context('spawn')
p = ctx.Process(target=print, args=('spawned',)); p.start(); p.join()
from multiprocessing import shared_memory
s = shared_memory.SharedMemory(create=True, size=4096); s.buf[0] = 1; s.close(); s.unlink()
""",
    "signals_and_time": r"""
import signal, time, os, threading, resource, select
hits = []
signal.signal(signal.SIGUSR1, lambda *a: hits.append(1))
os.kill(os.getpid(), signal.SIGUSR1); signal.raise_signal(signal.SIGUSR1)
signal.pthread_kill(threading.get_ident(), signal.SIGUSR1)
signal.signal(signal.SIGALRM, lambda *a: hits.append(2))
signal.alarm(1); signal.alarm(0)
signal.setitimer(signal.ITIMER_REAL, 0.01); time.sleep(0.05); signal.getitimer(signal.ITIMER_REAL)
signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGUSR2]); os.kill(os.getpid(), signal.SIGUSR2)
signal.sigpending(); signal.sigtimedwait([signal.SIGUSR2], 0.1)
signal.pthread_sigmask(signal.SIG_UNBLOCK, [signal.SIGUSR2])
signal.siginterrupt(signal.SIGUSR1, True); signal.getsignal(signal.SIGINT)
r, w = os.pipe(); os.set_blocking(w, False); old = signal.set_wakeup_fd(w); signal.set_wakeup_fd(old)
time.time(); time.monotonic(); time.perf_counter(); time.process_time(); time.thread_time()
time.clock_getres(time.CLOCK_MONOTONIC); time.clock_gettime(time.CLOCK_BOOTTIME); time.sleep(0.001)
time.localtime(); time.strftime('%c'); time.gmtime(); os.times()
resource.getrusage(resource.RUSAGE_SELF); resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
import datetime, zoneinfo
datetime.datetime.now(zoneinfo.ZoneInfo('Europe/Paris'))
os.getloadavg(); os.cpu_count(); os.sched_getaffinity(0); os.sched_yield(); os.nice(0)
os.getpriority(os.PRIO_PROCESS, 0); os.getpid(); os.getppid(); os.getuid(); os.geteuid(); os.getgid()
os.getegid(); os.getgroups(); os.getresuid(); os.getresgid(); os.getpgrp(); os.getpgid(0); os.getsid(0)
os.uname(); os.getlogin if False else None; os.ctermid(); os.get_terminal_size if False else None
import platform, socket, getpass, locale
platform.platform(); platform.uname(); socket.gethostname(); locale.getlocale(); locale.setlocale(locale.LC_ALL, '')
try:
    getpass.getuser()
except Exception:
    pass
print(hits)
""",
    "io_multiplexing": r"""
import select, selectors, os, socket
r, w = os.pipe(); os.write(w, b'x')
select.select([r], [w], [], 0)
p = select.poll(); p.register(r, select.POLLIN); p.poll(0)
e = select.epoll(); e.register(r, select.EPOLLIN); e.poll(0); e.close()
s = selectors.DefaultSelector(); s.register(r, selectors.EVENT_READ); s.select(0); s.close()
a, b = socket.socketpair(); a.sendall(b'hello'); b.recv(5); a.send(b'x'); b.recv_into(bytearray(1))
a.sendmsg([b'x']); b.recvmsg(1); b.setblocking(False); a.settimeout(1)
a.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF); a.getsockname(); b.getpeername(); a.shutdown(socket.SHUT_WR)
a.close(); b.close()
d1, d2 = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM); d1.send(b'x'); d2.recv(1)
socket.send_fds(d1, [b'x'], [r]); os.close(socket.recv_fds(d2, 1, 1)[1][0])
print('ok')
""",
    "memory_and_mmap": r"""
import mmap, os, gc, array, sys
m = mmap.mmap(-1, 2**20); m[:5] = b'hello'; m.resize(2**21) if hasattr(m, 'resize') else None; m.madvise(mmap.MADV_DONTNEED) if hasattr(m, 'madvise') else None; m.close()
with open('mm.bin', 'wb') as f:
    f.write(b'\0' * 65536)
with open('mm.bin', 'r+b') as f:
    m = mmap.mmap(f.fileno(), 0); m[0:1] = b'x'; m.flush(); m.find(b'x'); m.close()
big = bytearray(200 * 2**20); del big
x = [list(range(1000)) for _ in range(1000)]; del x; gc.collect()
print('ok')
""",
    "randomness_and_crypto": r"""
import os, random, secrets, uuid, hashlib, hmac, ssl
os.urandom(32); os.getrandom(16); secrets.token_hex(16); uuid.uuid4(); random.SystemRandom().random(); random.seed()
hashlib.sha256(b'x').hexdigest(); hashlib.blake2b(b'x'); hmac.new(b'k', b'm', 'sha256').digest()
ssl.create_default_context()
print('ok')
""",
    "interpreter": r"""
import sys, gc, faulthandler, traceback, warnings, logging, importlib, pickle, marshal, ctypes, ctypes.util, decimal, fractions, statistics, re, unicodedata, tracemalloc, pdb, inspect, dis, code, textwrap, difflib, html, xml.etree.ElementTree as ET, email, urllib.parse, base64, struct, functools, itertools, collections, heapq, bisect, copy, pprint, string, math, cmath, operator, enum, dataclasses, typing, contextlib, abc, weakref, io, codecs
faulthandler.enable(); faulthandler.dump_traceback(file=open('tb.txt', 'w')); faulthandler.disable()
logging.basicConfig(filename='log.txt'); logging.warning('x')
tracemalloc.start(); tracemalloc.stop()
compile('x = 1', 'f', 'exec'); exec('y = 2'); eval('1 + 1')
libc = ctypes.CDLL(None); libc.getpid(); ctypes.util.find_library('c')
CB = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_int)
cb = CB(lambda v: v + 1); print(cb(1))
qsort_cmp = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(ctypes.c_int), ctypes.POINTER(ctypes.c_int))(lambda a, b: a[0] - b[0])
arr = (ctypes.c_int * 5)(5, 1, 4, 2, 3); libc.qsort(arr, 5, ctypes.sizeof(ctypes.c_int), qsort_cmp); print(list(arr))
try:
    1 / 0
except ZeroDivisionError:
    traceback.format_exc()
sys.setrecursionlimit(2000); sys.getsizeof(1); sys.settrace(None)
print('ok')
""",
    "numpy": r"""
try:
    import numpy as np
except ImportError:
    print('no numpy')
else:
    a = np.random.default_rng(0).random((300, 300))
    np.linalg.inv(a); np.linalg.svd(a); a @ a; np.fft.fft(a[0]); np.sort(a, axis=None)
    np.save('a.npy', a); np.load('a.npy'); np.savetxt('a.txt', a[:3]); np.loadtxt('a.txt')
    m = np.memmap('m.dat', dtype='float32', mode='w+', shape=(1000,)); m[:] = 1; m.flush(); del m
    print(float(a.sum()))
""",
    "pandas": r"""
try:
    import pandas as pd
except ImportError:
    print('no pandas')
else:
    df = pd.DataFrame({'a': range(1000), 'b': [i % 7 for i in range(1000)], 't': pd.date_range('2024-01-01', periods=1000, freq='h')})
    df.to_csv('df.csv', index=False); df2 = pd.read_csv('df.csv', parse_dates=['t'])
    df2.groupby('b').a.agg(['sum', 'mean']); df2.merge(df2, on='a').pivot_table(index='b_x', values='a', aggfunc='sum')
    df2.set_index('t').resample('D').sum(); df2.to_json('df.json'); pd.read_json('df.json')
    df2['t'].dt.tz_localize('UTC').dt.tz_convert('US/Eastern'); df2.describe(); df2[['a', 'b']].rolling(5).mean()
    df2.to_pickle('df.pkl'); pd.read_pickle('df.pkl'); df2.to_html(); str(df2)
    print(len(df2))
""",
    "matplotlib": r"""
try:
    import matplotlib
except ImportError:
    print('no matplotlib')
else:
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(); ax.plot([1, 2, 3], [3, 1, 2]); ax.set_title('t'); fig.savefig('plot.png'); fig.savefig('plot.svg'); plt.close(fig)
    print('ok')
""",
    "helpers": r"""
print(llm_query('hello'))
print(llm_query_batch(['a', 'b', 'c']))
""",
}


# Made by the workload, refused by the filter, and no step fails for it.
EXPECTED_REFUSALS = {
    "clone3": "ENOSYS: glibc then uses clone, whose flags the filter can read",
    "socket": "EPERM: glibc's user and host lookups (id, ps, git) try nscd's socket, then "
    "read the files",
}


async def _echo(prompt, **_):
    return f"echo: {prompt}"


async def _batch(prompts, **_):
    return [f"echo: {p}" for p in prompts]


HELPERS = {"llm_query": _echo, "llm_query_batch": _batch}


def _traced_popen(trace: str):
    """subprocess.Popen for the sandbox module only: the worker starts under strace."""
    real = subprocess.Popen

    class Popen(real):  # type: ignore[misc, valid-type]
        def __init__(self, args, *rest, **kwargs):
            if isinstance(args, list) and len(args) > 2 and args[2] == sandbox_process._WORKER:
                args = ["strace", "-f", "-qq", "-o", trace, *args]
            super().__init__(args, *rest, **kwargs)

    return Popen


def _strace_child(pid: int) -> int:
    """The worker's pid: the one child of the strace process we started."""
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as file:
                    fields = file.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid:
                return int(entry)
    return pid


async def run_workload(trace: str, names: list[str]) -> dict[str, str]:
    sandbox_process.subprocess.Popen = _traced_popen(trace)  # type: ignore[misc]
    map_ids = sandbox_process._map_ids
    sandbox_process._map_ids = lambda pid: map_ids(_strace_child(pid))  # type: ignore[assignment]
    repl = SandboxREPL("ctx", HELPERS)
    outputs = {}
    try:
        await repl.start()
        for name in names:
            output = await repl.run(WORKLOAD[name], timeout=240)
            outputs[name] = output.as_text()
        print("isolation:", repl.isolation)
    finally:
        await repl.aclose()
    return outputs


_LINE = re.compile(r"^(\d+)\s+(?:<\.\.\. (\w+) resumed>|(\w+)\()(.*)$")
_RESULT = re.compile(r"\)\s+=\s+(-?\w+)(?:\s+(E[A-Z]+))?")


def read_trace(trace: str) -> tuple[collections.Counter, collections.Counter]:
    """Syscalls made under the filter (by the worker after it applied it, and by every
    process it started), and those that failed with EPERM or ENOSYS."""
    used: collections.Counter = collections.Counter()
    refused: collections.Counter = collections.Counter()
    relay = worker = None  # the first process (it only relays signals), pid 1 inside
    filtered: set[int] = set()
    pending: dict[int, str] = {}
    with open(trace, errors="replace") as file:
        for line in file:
            match = _LINE.match(line)
            if not match:
                continue
            pid, resumed, name, rest = int(match[1]), match[2], match[3], match[4]
            relay = pid if relay is None else relay
            if name is not None:
                if worker is None and pid != relay and "PR_SET_SECCOMP" in rest:
                    worker = pid  # the filter holds from its next call on
                    filtered.add(pid)
                    continue
                if worker is not None and pid != relay:
                    filtered.add(pid)  # the worker, or a process or thread it started
                if pid in filtered:
                    used[name] += 1
                if "<unfinished ...>" in rest:
                    pending[pid] = name
                    continue
            else:
                name = pending.pop(pid, resumed)
            if pid in filtered:
                result = _RESULT.search(rest)
                if result and result[2] in ("EPERM", "ENOSYS", "EACCES"):
                    refused[f"{name} {result[2]}"] += 1
    return used, refused


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="*", default=list(WORKLOAD), choices=list(WORKLOAD))
    parser.add_argument("--names", action="store_true", help="print the used names only")
    parser.add_argument("--keep", help="keep the raw trace in this file")
    args = parser.parse_args()
    if not shutil.which("strace") or current_arch() is None:
        print("needs Linux (x86_64 or aarch64) and strace", file=sys.stderr)
        return 2
    folder = tempfile.mkdtemp(prefix="rlm-syscalls-")
    os.chmod(folder, 0o755)
    trace = os.path.join(folder, "trace")
    try:
        outputs = asyncio.run(run_workload(trace, args.only))
        used, refused = read_trace(trace)
        if args.keep:
            shutil.copy(trace, args.keep)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    failed = {
        name: text for name, text in outputs.items() if "Error" in text or "Traceback" in text
    }
    allowed = set(ALLOWED_SYSCALLS)
    if args.names:
        print(" ".join(sorted(used)))
        return 0
    print(f"\n{len(used)} syscalls made under the filter ({len(allowed)} allowed):")
    for name, count in sorted(used.items()):
        print(f"  {name:24} {count:8}  {'allowed' if name in allowed else 'NOT ALLOWED'}")
    print("\nfailed with EPERM/ENOSYS/EACCES (the kernel's or the filter's answer):")
    for what, count in sorted(refused.items()):
        print(f"  {what:32} {count:6}")
    for name, text in failed.items():
        print(f"\nstep {name!r} failed:\n{text[-1500:]}")
    for name, text in outputs.items():
        print(f"{name}: {text.strip()[-200:]!r}")
    missing = sorted(set(used) - allowed - set(EXPECTED_REFUSALS))
    for name, why in EXPECTED_REFUSALS.items():
        print(f"refused on purpose: {name} ({why})")
    if missing:
        print("\nmade but not allowed:", " ".join(missing))
    return 1 if missing or failed else 0


if __name__ == "__main__":
    del isolation  # imported for its side effect of checking the package loads
    sys.exit(main())
