// The wasm sandbox: CPython compiled to WebAssembly (Pyodide) in a Deno process that the
// kernel starts with no network, no environment, no subprocesses, no FFI and reads of
// Pyodide's own files only, revoked once Pyodide has loaded. Model code that reaches
// JavaScript (`import js`) still meets Deno's permissions.
//
// The bridge is the process's stdin and stdout, framed as repl/bridge.py frames them;
// stdout carries frames only (console output goes to stderr). The Python side
// (pyodide_worker.py and the shared REPL code) comes from the kernel in the first frame.
//
// `runner.js SNAPSHOT` starts from SNAPSHOT, Pyodide's memory as it was once loaded with
// the standard library modules the worker needs (half a second, where a fresh load
// takes several); `runner.js --make-snapshot SNAPSHOT` makes it, once per cache, with no
// model code anywhere near (wasm.py runs it after fetching Pyodide).
import { loadPyodide } from "npm:pyodide@314.0.8";

console.log = console.info = console.debug = console.warn = console.error;
const quiet = () => {}; // what Python writes past its own capture reaches no one
const PRELOADED = "import asyncio, ast, base64, concurrent.futures, contextvars, hashlib, io, " +
  "itertools, json, pickle, queue, re, struct, traceback, types, warnings";

if (Deno.args[0] === "--make-snapshot") {
  const fresh = await loadPyodide({ _makeSnapshot: true, stdout: quiet, stderr: quiet });
  fresh.runPython(PRELOADED);
  const snapshot = fresh.makeMemorySnapshot();
  const part = `${Deno.args[1]}.${Deno.pid}.part`; // two kernels may make it at once
  Deno.writeFileSync(part, snapshot);
  Deno.renameSync(part, Deno.args[1]);
  Deno.exit(0);
}

const load = async () => {
  try {
    const snapshot = Deno.readFileSync(Deno.args[0]);
    return await loadPyodide({ _loadSnapshot: snapshot, stdout: quiet, stderr: quiet });
  } catch {
    const fresh = await loadPyodide({ stdout: quiet, stderr: quiet }); // no snapshot (yet)
    fresh.runPython(PRELOADED);
    return fresh;
  }
};

const RING_BYTES = 1 << 22;
const ring = new SharedArrayBuffer(RING_BYTES);
const state = new Int32Array(new SharedArrayBuffer(16)); // written, read, closed
const interrupt = new Int32Array(new SharedArrayBuffer(4));
const reader = new Worker(new URL("./reader.js", import.meta.url).href, { type: "module" });
reader.postMessage({ ring, state, interrupt });

// What would let model code write to disk or run beside the step, past Deno's
// permissions: Web Storage and the Cache API write under DENO_DIR without asking for
// write access (and outlive the run), and a Worker runs on after a step is stopped.
for (const name of ["localStorage", "sessionStorage", "caches", "Worker", "SharedWorker"]) {
  delete globalThis[name];
  if (name in globalThis) throw new Error(`the sandbox could not remove ${name}`);
}

const pyodide = await load();
await Deno.permissions.revoke({ name: "read" });
pyodide.setInterruptBuffer(interrupt);

const bytes = new Uint8Array(ring);
const host = {
  // Up to `n` bytes from the kernel: waits up to `ms` (forever if negative) for the
  // first; an empty array when the time is up or (if `wake`) an interrupt came,
  // undefined (None) at the end.
  read(n, ms, wake) {
    for (;;) {
      const written = Atomics.load(state, 0), read = Atomics.load(state, 1);
      const ready = (written - read) | 0;
      if (ready > 0) {
        const start = read & (RING_BYTES - 1);
        const count = Math.min(n, ready, RING_BYTES - start);
        const out = bytes.slice(start, start + count);
        Atomics.store(state, 1, (read + count) | 0);
        Atomics.notify(state, 1);
        return out;
      }
      if (Atomics.load(state, 2)) return undefined;
      if (wake && Atomics.load(interrupt, 0)) return new Uint8Array(0);
      const waited = Atomics.wait(state, 0, written, ms < 0 ? Infinity : ms);
      if (waited === "timed-out") return new Uint8Array(0);
    }
  },
  // Python's bytes, seen through its buffer (no copy).
  write(bytes) {
    const buffer = bytes.getBuffer("u8");
    try {
      const data = buffer.data;
      let at = 0;
      while (at < data.length) at += Deno.stdout.writeSync(data.subarray(at));
    } finally {
      buffer.release();
    }
  },
  // An interrupt the kernel sent and Python has not taken yet; taking it clears it.
  take_interrupt() {
    return Atomics.exchange(interrupt, 0, 0) !== 0;
  },
  // An interrupt in `ms` milliseconds (none if 0), from the reader's thread.
  alarm(ms) {
    reader.postMessage({ alarm: ms });
  },
  // A sleep that an interrupt ends early.
  sleep(ms) {
    if (!Atomics.load(interrupt, 0)) Atomics.wait(interrupt, 0, 0, ms);
  },
};
pyodide.registerJsModule("rlm_host", host);
try {
  pyodide.runPython(`
import struct, json, os, sys, rlm_host

def _exactly(n):
    parts, got = [], 0
    while got < n:
        chunk = rlm_host.read(n - got, -1)
        if chunk is None:
            raise SystemExit(1)
        data = chunk.to_bytes()
        parts.append(data)
        got += len(data)
    return b"".join(parts)

_kind, _length = struct.unpack(">cQ", _exactly(9))
_boot = json.loads(_exactly(_length))
for _path, _source in _boot["files"].items():
    _full = os.path.join("/rlm", _path)
    os.makedirs(os.path.dirname(_full), exist_ok=True)
    with open(_full, "w") as _file:
        _file.write(_source)
sys.path.insert(0, "/rlm")
del _kind, _length, _boot, _path, _source, _full, _file
import pyodide_worker
pyodide_worker.main(_exactly)
`);
} catch (error) {
  console.error(String(error));
  Deno.exit(1);
}
Deno.exit(0);
