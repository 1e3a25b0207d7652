"""The runner cargo uses for wasm32-wasip1 (CARGO_TARGET_WASM32_WASIP1_RUNNER, set by
env.sh): `python run-wasi.py module.wasm args...` runs the module in wasmtime (the PyPI
`wasmtime` package, in the virtual environment env.sh makes) with the host's / preopened
as /, the environment and the standard streams passed through, and exits with the
module's exit code; a trap (a panic aborts on wasm) prints wasmtime's message and backtrace
and exits with 134.

Not Node.js: Node 20 crashes (SIGSEGV or SIGTRAP) now and then as a module that loaded a
model returns, after the tests passed, whatever the flags; wasmtime does not. Node runs
the benchmarks (`run-wasi.mjs`: V8 is the browsers' engine).
"""

import os
import sys

from wasmtime import Engine, ExitTrap, Linker, Module, Store, Trap, WasiConfig


def main() -> int:
    engine = Engine()
    store = Store(engine)
    wasi = WasiConfig()
    wasi.argv = sys.argv[1:]
    wasi.env = list(os.environ.items())
    wasi.inherit_stdin()
    wasi.inherit_stdout()
    wasi.inherit_stderr()
    wasi.preopen_dir("/", "/")
    store.set_wasi(wasi)
    linker = Linker(engine)
    linker.define_wasi()
    instance = linker.instantiate(store, Module.from_file(engine, sys.argv[1]))
    try:
        instance.exports(store)["_start"](store)
    except ExitTrap as e:
        return e.code
    except Trap as e:
        print(f"run-wasi: the module trapped: {e}", file=sys.stderr)
        return 134
    return 0


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
