// kvcore in a Web Worker: instantiates kvcore_web_relaxed.wasm or kvcore_web.wasm (see
// instantiate; web/src/ffi.rs has their exports and imports), loads a GGUF into it and
// runs chat replies, posting to the page:
//   {type: "status", text}                      what is happening
//   {type: "module", name}                      the module compiled (kvcore_web.wasm or
//                                               kvcore_web_relaxed.wasm: see instantiate)
//   {type: "progress", loaded, total}           model bytes read so far
//   {type: "loaded", name, bytes, ms, acts}     a model is ready
//   {type: "nomodel"}                           no model.gguf beside the page: pick a file
//   {type: "text", text}                        the next piece of the reply
//   {type: "stats", tokens, tokPerS, kvBytes, phase}  phase: "prefill" | "decode" | "done"
//   {type: "done", ok: true} | {type: "error", message}
//   {type: "reset", kvBytes}                    the conversation is forgotten
// and receiving {type: "load", file, acts} (a File from the picker, or no file: model.gguf
// again), {type: "chat", text, maxTokens} and {type: "reset"}; acts is "f32" or "q8"
// (8-bit activations), the first load's from this script's URL (worker.js?acts=q8). kv_chat runs synchronously here: the page stays
// responsive and receives the pieces as they are posted.

const PHASES = ["prefill", "decode", "done"];
const decoder = new TextDecoder("utf-8", { fatal: false });
const encoder = new TextEncoder();
let wasm = null; // the instance's exports
let busy = false;

const post = (m) => self.postMessage(m);
// A view of the module's memory, fetched anew each time: the buffer is replaced
// whenever the memory grows.
const bytes = (ptr, len) => new Uint8Array(wasm.memory.buffer, ptr, len);

function lastError() {
  const len = wasm.kv_error_len();
  return len ? decoder.decode(bytes(wasm.kv_error_ptr(), len).slice()) : "unknown error";
}

const imports = {
  env: {
    on_text(ptr, len) {
      post({ type: "text", text: decoder.decode(bytes(ptr, len).slice()) });
    },
    on_stats(tokens, tokPerS, kvBytes, phase) {
      post({ type: "stats", tokens, tokPerS, kvBytes, phase: PHASES[phase] ?? "decode" });
    },
    now_ms: () => performance.now(),
    fill_random(ptr, len) {
      try {
        // getRandomValues fills at most 65536 bytes per call.
        for (let off = 0; off < len; off += 65536) {
          crypto.getRandomValues(bytes(ptr + off, Math.min(65536, len - off)));
        }
        return 0;
      } catch (e) {
        console.error("fill_random:", e);
        return 1;
      }
    },
  },
};

// A module of one function using i32x4.relaxed_dot_i8x16_i7x16_add_s: it validates where
// the engine has relaxed SIMD (Chrome 114+; not yet everywhere, and not in Node 20
// without a flag).
const RELAXED_PROBE = new Uint8Array([
  0, 97, 115, 109, 1, 0, 0, 0, 1, 5, 1, 96, 0, 1, 123, 3, 2, 1, 0, 10, 61, 1, 59, 0,
  253, 12, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
  253, 12, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
  253, 12, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 253, 147, 2, 11,
]);

// Compiles and instantiates a module beside this script; null if the server has no
// such file (HTTP 404).
async function instantiateFile(name) {
  const url = new URL(name, import.meta.url);
  const res = await fetch(url);
  if (res.status === 404) return null;
  if (!res.ok) throw new Error(`cannot fetch ${url}: HTTP ${res.status}`);
  if (res.headers.get("Content-Type") === "application/wasm") {
    const { instance } = await WebAssembly.instantiateStreaming(res, imports);
    return instance.exports;
  }
  // A server that does not send application/wasm: compile from the bytes instead.
  const { instance } = await WebAssembly.instantiate(await res.arrayBuffer(), imports);
  return instance.exports;
}

// kvcore_web_relaxed.wasm (SIMD128 with relaxed SIMD's integer dot and multiply-add:
// 6-18 % faster decode in Chromium) where the engine validates relaxed SIMD and the
// server has the file, else kvcore_web.wasm (SIMD128). Returns [exports, its name].
async function instantiate() {
  const names = WebAssembly.validate(RELAXED_PROBE)
    ? ["kvcore_web_relaxed.wasm", "kvcore_web.wasm"]
    : ["kvcore_web.wasm"];
  for (const name of names) {
    post({ type: "status", text: `compiling ${name}…` });
    const exports = await instantiateFile(name);
    if (exports) return [exports, name];
  }
  throw new Error("no kvcore_web.wasm beside the page (HTTP 404)");
}

// Copies a stream of `total` bytes (or an unknown size: null) into a kv_alloc buffer,
// reporting progress; returns [ptr, len].
async function readInto(stream, total) {
  if (total == null) {
    // Unknown size: gather the chunks first, then copy once.
    const chunks = [];
    let n = 0;
    for (const reader = stream.getReader(); ; ) {
      const { done, value } = await reader.read();
      if (done) break;
      chunks.push(value);
      n += value.length;
      post({ type: "progress", loaded: n, total: null });
    }
    const ptr = alloc(n);
    let off = 0;
    for (const c of chunks) {
      bytes(ptr + off, c.length).set(c);
      off += c.length;
    }
    return [ptr, n];
  }
  const ptr = alloc(total);
  let off = 0;
  let lastPost = 0;
  try {
    for (const reader = stream.getReader(); ; ) {
      const { done, value } = await reader.read();
      if (done) break;
      if (off + value.length > total) throw new Error("the file is longer than its stated size");
      bytes(ptr + off, value.length).set(value);
      off += value.length;
      if (off - lastPost > (1 << 22) || off === total) {
        lastPost = off;
        post({ type: "progress", loaded: off, total });
      }
    }
    if (off !== total) throw new Error(`read ${off} of ${total} bytes`);
  } catch (e) {
    wasm.kv_free(ptr, total);
    throw e;
  }
  return [ptr, total];
}

function alloc(n) {
  const ptr = wasm.kv_alloc(n);
  if (!ptr) throw new Error(lastError());
  return ptr;
}

async function load(stream, total, name, acts) {
  const t0 = performance.now();
  post({ type: "status", text: `reading ${name}…` });
  const [ptr, len] = await readInto(stream, total);
  post({ type: "status", text: `loading ${name} (${(len / 2 ** 20).toFixed(1)} MiB)…` });
  // Let the status message go out before the synchronous load.
  await new Promise((r) => setTimeout(r, 0));
  if (wasm.kv_load(ptr, len, acts === "q8" ? 1 : 0) !== 0) {
    throw new Error(`cannot load ${name}: ${lastError()}`);
  }
  post({ type: "loaded", name, bytes: len, ms: performance.now() - t0, acts });
}

// model.gguf beside the page, if it is served: whether it was.
async function loadServed(acts) {
  const res = await fetch(new URL("model.gguf", self.location.href), { cache: "no-store" }).catch(() => null);
  if (!(res && res.ok && res.body)) return false;
  // A compressed response's length is not the file's: read it to the end instead.
  const len = res.headers.get("content-encoding") ? NaN : Number(res.headers.get("content-length"));
  await load(res.body, Number.isFinite(len) && len > 0 ? len : null, "model.gguf", acts);
  return true;
}

function chat(text, maxTokens) {
  const msg = encoder.encode(text);
  const ptr = alloc(msg.length);
  bytes(ptr, msg.length).set(msg);
  try {
    const rc = wasm.kv_chat(ptr, msg.length, maxTokens);
    if (rc !== 0) throw new Error(lastError());
  } finally {
    wasm.kv_free(ptr, msg.length);
  }
}

function fail(e) {
  const message = e instanceof Error ? e.message : String(e);
  console.error("kvcore worker:", message);
  post({ type: "error", message });
}

self.onmessage = async (ev) => {
  const m = ev.data;
  if (!wasm) return fail("the module is not ready yet");
  if (busy) return fail("busy: wait for the current request to finish");
  busy = true;
  try {
    if (m.type === "load" && m.file) {
      await load(m.file.stream(), m.file.size, m.file.name, m.acts);
    } else if (m.type === "load") {
      if (!(await loadServed(m.acts))) throw new Error("model.gguf is no longer served");
    } else if (m.type === "chat") {
      chat(m.text, m.maxTokens ?? 256);
      post({ type: "done", ok: true });
    } else if (m.type === "reset") {
      if (wasm.kv_reset() !== 0) throw new Error(lastError());
      post({ type: "reset", kvBytes: wasm.kv_kv_bytes() });
    } else {
      throw new Error(`unknown request ${m.type}`);
    }
  } catch (e) {
    fail(e);
  } finally {
    busy = false;
  }
};

(async () => {
  busy = true;
  try {
    let name;
    [wasm, name] = await instantiate();
    post({ type: "module", name });
    // A model served beside the page loads by itself; otherwise the page asks for a file.
    const acts = new URL(import.meta.url).searchParams.get("acts") === "q8" ? "q8" : "f32";
    if (!(await loadServed(acts))) post({ type: "nomodel" });
  } catch (e) {
    fail(e);
  } finally {
    busy = false;
  }
})();
