// The wasm sandbox's stdin, read on a thread of its own (a Web Worker) so that the
// kernel reaches the sandbox while Python runs on the main thread: frames go into a
// shared ring the main thread waits on, and an interrupt frame (kind "I", no body) is
// not passed on but sets Pyodide's interrupt buffer at once, as SIGINT does in the
// process sandbox (signals do not exist on Windows, and Deno only sees them between
// turns of a loop that Python blocks).
//
// Reading never waits for the ring: what does not fit waits in a queue, moved on as
// Python takes from the ring, so an interrupt behind megabytes of answers still gets
// through. The queue is bounded (QUEUE_MOST): past it, stdin waits, and the kernel,
// whose replies then go unread, stops the sandbox (sandbox/process.py MAX_UNREAD).
const HEADER = 9; // kind (1 byte) and length (8 bytes, big-endian): repl/bridge.py
const INTERRUPT = 0x49; // bridge.INTERRUPT_KIND, "I"
const QUEUE_MOST = 48 * 2 ** 20;

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
  const queue = []; // pieces for the ring, in order
  let queued = 0; // their bytes
  let moving = false; // a task is moving them
  let moved = Promise.resolve(); // the last such task
  let roomWaiter = null; // stdin's wait for the queue to shrink

  // As much of the queue as the ring has room for: state[0] counts bytes written,
  // state[1] bytes read, both modulo 2**32. When the ring is full, wait (without
  // blocking this thread) for Python to read.
  const move = async () => {
    moving = true;
    while (queue.length) {
      const written = Atomics.load(state, 0), read = Atomics.load(state, 1);
      const free = size - ((written - read) | 0);
      if (free === 0) {
        const waited = Atomics.waitAsync(state, 1, read);
        if (waited.async) await waited.value;
        continue;
      }
      const piece = queue[0];
      const start = written & (size - 1);
      const n = Math.min(free, piece.length, size - start);
      bytes.set(piece.subarray(0, n), start);
      Atomics.store(state, 0, (written + n) | 0);
      Atomics.notify(state, 0);
      if (n === piece.length) queue.shift();
      else queue[0] = piece.subarray(n);
      queued -= n;
      if (roomWaiter && queued < QUEUE_MOST) roomWaiter();
    }
    moving = false;
  };
  const put = (piece) => {
    queue.push(piece.slice()); // (stdin's chunk may be reused)
    queued += piece.length;
    if (!moving) moved = move();
  };

  const header = new Uint8Array(HEADER);
  let have = 0; // bytes of a header read so far
  let left = 0; // bytes of a frame's body still to come
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
    if (queued >= QUEUE_MOST) await new Promise((resolve) => (roomWaiter = resolve));
    roomWaiter = null;
  }
  await moved;
  Atomics.store(state, 2, 1); // the kernel closed our stdin
  Atomics.notify(state, 0);
};
