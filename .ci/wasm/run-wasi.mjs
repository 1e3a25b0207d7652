// The WASI runner cargo uses for wasm32-wasip1 (CARGO_TARGET_WASM32_WASIP1_RUNNER):
// `node --no-warnings run-wasi.mjs module.wasm args…`, the host's / preopened, the
// environment passed through, the module's exit code returned (run it with
// --single-threaded-gc: see env.sh).
import { readFile } from 'node:fs/promises';
import { WASI } from 'node:wasi';
import { argv, env } from 'node:process';
const wasi = new WASI({ version: 'preview1', args: argv.slice(2), env, preopens: { '/': '/' }, returnOnExit: true });
const mod = await WebAssembly.compile(await readFile(argv[2]));
process.exitCode = wasi.start(await WebAssembly.instantiate(mod, wasi.getImportObject()));
