// Times the page's module (kvcore_web.wasm) under Node.js, without a browser: the same
// exports the worker calls (kv_alloc, kv_load, kv_reset, kv_chat), the story prompt of
// page_test.py --bench, a 256-token reply twice; prints the final stats of each reply as
// a JSON line ({tokens, tokPerS}: decode tok/s). It separates the engine from the
// browser: BENCHMARKS.md compares it with the page's own figure.
//   node web/tests/node_chat.mjs target/web/kvcore_web.wasm MODEL.gguf [f32|q8]
import fs from "node:fs";
import { webcrypto } from "node:crypto";

const [wasmPath, modelPath, acts = "f32"] = process.argv.slice(2);
if (!wasmPath || !modelPath) {
  console.error("usage: node node_chat.mjs kvcore_web.wasm MODEL.gguf [f32|q8]");
  process.exit(2);
}
let w = null;
const bytes = (ptr, len) => new Uint8Array(w.memory.buffer, ptr, len);
const imports = {
  env: {
    on_text() {},
    on_stats(tokens, tokPerS, kvBytes, phase) {
      if (phase === 2) console.log(JSON.stringify({ acts, tokens, tokPerS: +tokPerS.toFixed(2) }));
    },
    now_ms: () => performance.now(),
    fill_random(ptr, len) {
      for (let off = 0; off < len; off += 65536) {
        webcrypto.getRandomValues(bytes(ptr + off, Math.min(65536, len - off)));
      }
      return 0;
    },
  },
};
const fail = (what) => {
  const len = w.kv_error_len();
  const msg = len ? new TextDecoder().decode(bytes(w.kv_error_ptr(), len).slice()) : "unknown error";
  console.error(`node_chat: ${what}: ${msg}`);
  process.exit(1);
};
w = (await WebAssembly.instantiate(fs.readFileSync(wasmPath), imports)).instance.exports;
const model = fs.readFileSync(modelPath);
const ptr = w.kv_alloc(model.length);
if (!ptr) fail("kv_alloc");
bytes(ptr, model.length).set(model);
if (w.kv_load(ptr, model.length, acts === "q8" ? 1 : 0) !== 0) fail("kv_load");
const text = new TextEncoder().encode("Write a long story about a lighthouse keeper and a storm.");
for (let r = 0; r < 2; r++) {
  if (w.kv_reset() !== 0) fail("kv_reset");
  const q = w.kv_alloc(text.length);
  bytes(q, text.length).set(text);
  if (w.kv_chat(q, text.length, 256) !== 0) fail("kv_chat");
  w.kv_free(q, text.length);
}
