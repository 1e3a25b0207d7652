#!/usr/bin/env bash
# The Python package (bindings/python, docs/python.md): the crate's fmt and clippy, a
# release build into a venv with maturin, the abi3 wheel and what it ships, the stubs
# (mypy --strict, and stubtest against the built module), and the pytest suite (the
# reference's greedy continuations, session reuse, fork / truncate / save / load, GIL
# release, streaming and cancellation, the exception classes) against SmolLM2 from the
# user cache (fetched by the engine if missing).
#
# Usage: .ci/python.sh   (CPython >= 3.9 as python3, or $PYTHON; PyPI and crates.io
# reachable; installs python3-venv with apt-get when the interpreter lacks venv)
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=lib.sh
. .ci/lib.sh

crate=bindings/python
venv=$crate/target/ci-venv
step() { printf -- '--- %s (%s)\n' "$1" "$(date -u +%H:%M:%S)"; }
start=$(date +%s)

step "venv: maturin, numpy, pytest, mypy (pinned)"
make_venv "$venv"
export VIRTUAL_ENV=$PWD/$venv
export PATH=$VIRTUAL_ENV/bin:$PATH
# pyo3's build script and maturin use the venv's interpreter.
export PYO3_PYTHON=$VIRTUAL_ENV/bin/python
python -m pip install -q --disable-pip-version-check maturin==1.16.0 numpy==2.4.6 pytest==9.2.0 mypy==2.4.1
python --version
maturin --version

step "lint: cargo fmt --check, clippy -D warnings (the crate has its own workspace)"
cargo fmt --manifest-path $crate/Cargo.toml -- --check
cargo clippy --manifest-path $crate/Cargo.toml --all-targets -- -D warnings

step "build: maturin develop --release"
(cd $crate && maturin develop --release)

step "wheel: maturin build --release (abi3, with the stubs and py.typed)"
rm -rf $crate/target/wheels
(cd $crate && maturin build --release --out target/wheels)
wheel=$(ls $crate/target/wheels/*.whl)
echo "$wheel"
case "$(basename "$wheel")" in
    kvcore-*-cp39-abi3-*.whl) ;;
    *) echo "the wheel is not abi3 for CPython >= 3.9: $wheel" >&2; exit 1 ;;
esac
python - "$wheel" <<'PY'
import sys, zipfile
names = set(zipfile.ZipFile(sys.argv[1]).namelist())
need = ["kvcore/__init__.py", "kvcore/_errors.py", "kvcore/_kvcore.pyi", "kvcore/py.typed"]
missing = [n for n in need if n not in names]
if missing or not any(n.startswith("kvcore/_kvcore.") and n.endswith(".so") for n in names):
    sys.exit(f"the wheel lacks {missing or 'the extension'}: {sorted(names)}")
PY

step "stubs: mypy --strict on the package, stubtest against the built module"
(cd $crate && python -m mypy --strict python/kvcore)
python -m mypy.stubtest kvcore._kvcore kvcore._errors

step "tests: pytest"
python -m pytest -q $crate/tests

step "README's Python snippet, as written"
awk '/<!-- ci: readme.py -->/ {on = 1; next} on && /^```python$/ {inside = 1; next}
     inside && /^```$/ {exit} inside {print}' README.md >$crate/target/readme.py
[ -s $crate/target/readme.py ] || { echo "README has no Python snippet after <!-- ci: readme.py -->" >&2; exit 1; }
python $crate/target/readme.py | tee $crate/target/readme.out
grep -q "Rome" $crate/target/readme.out

echo "Python package: lint, build, abi3 wheel and tests pass in $(( $(date +%s) - start )) s"
