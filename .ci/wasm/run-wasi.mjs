// Node.js as a WASI host, for benchmarks (V8 is the browsers' engine): `node --no-warnings
// --single-threaded-gc run-wasi.mjs module.wasm args…`, the host's / preopened, the
// environment passed through, the module's exit code returned. The tests run in wasmtime
// instead (run-wasi.py says why).
import { readFile } from 'node:fs/promises';
import { WASI } from 'node:wasi';
import { argv, env } from 'node:process';
const wasi = new WASI({ version: 'preview1', args: argv.slice(2), env, preopens: { '/': '/' }, returnOnExit: true });
const mod = await WebAssembly.compile(await readFile(argv[2]));
process.exitCode = wasi.start(await WebAssembly.instantiate(mod, wasi.getImportObject()));
