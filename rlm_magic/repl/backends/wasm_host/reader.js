// The wasm sandbox's stdin, read on a thread of its own (a Web Worker) so that the
// kernel reaches the sandbox while Python runs on the main thread: frames go into a
// shared ring the main thread waits on, and an interrupt frame (kind "I", no body) is
// not passed on but sets Pyodide's interrupt buffer at once, as SIGINT does in the
// process sandbox (signals do not exist on Windows, and Deno only sees them between
// turns of a loop that Python blocks).
const HEADER = 9; // kind (1 byte) and length (8 bytes, big-endian): repl/bridge.py
const INTERRUPT = 0x49; // "I"

let interrupt = null; // Pyodide's interrupt buffer
let alarm = null; // a replay's time limit (pyodide_worker.WasmWorker.stop_after)

const raise = () => {
  Atomics.store(interrupt, 0, 2); // SIGINT
  Atomics.notify(interrupt, 0); // a sleep ends
};

self.onmessage = ({ data }) => {
  if ("alarm" in data) {
    clearTimeout(alarm);
    alarm = data.alarm > 0 ? setTimeout(raise, data.alarm) : null;
  } else {
    interrupt = data.interrupt;
    read(data.ring, data.state);
  }
};

const read = async (ring, state) => {
  const bytes = new Uint8Array(ring);
  const size = bytes.length; // a power of two
  const header = new Uint8Array(HEADER);
  let have = 0; // bytes of a header read so far
  let left = 0; // bytes of a frame's body still to come

  // Into the ring, waiting while it is full: state[0] counts bytes written, state[1]
  // bytes read, both modulo 2**32.
  const put = (data) => {
    let at = 0;
    while (at < data.length) {
      const written = Atomics.load(state, 0), read = Atomics.load(state, 1);
      const free = size - ((written - read) | 0);
      if (free === 0) {
        Atomics.wait(state, 1, read);
        continue;
      }
      const start = written & (size - 1);
      const n = Math.min(free, data.length - at, size - start);
      bytes.set(data.subarray(at, at + n), start);
      Atomics.store(state, 0, (written + n) | 0);
      Atomics.notify(state, 0);
      at += n;
    }
  };

  for await (const chunk of Deno.stdin.readable) {
    let i = 0;
    while (i < chunk.length) {
      if (left > 0) {
        const n = Math.min(left, chunk.length - i);
        put(chunk.subarray(i, i + n));
        i += n;
        left -= n;
        continue;
      }
      header[have++] = chunk[i++];
      if (have < HEADER) continue;
      have = 0;
      const length = Number(new DataView(header.buffer).getBigUint64(1));
      if (header[0] === INTERRUPT) {
        raise();
        Atomics.notify(state, 0); // a wait for the kernel's answer ends
        continue;
      }
      put(header);
      left = length;
    }
  }
  Atomics.store(state, 2, 1); // the kernel closed our stdin
  Atomics.notify(state, 0);
};
