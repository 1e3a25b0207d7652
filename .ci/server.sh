#!/usr/bin/env bash
# `kvcore serve` with the official `openai` Python client (server/tests/openai_client.py):
# starts the release binary on a loopback port the OS picks, runs the client test, then
# sends SIGTERM and requires exit status 0; server/tests/hostile_clients.py and
# server/tests/load_hostile.py run raw TCP clients against servers of their own;
# server/tests/tier_redis.py and gateway_smg.py run replicas with the prefix cache's tier,
# the latter behind the `smg` gateway. The load test (cli/tests/serve_load.rs) and
# the HTTP tests (cli/tests/serve.rs) run in `cargo test`.
#
# Usage: .ci/server.sh   (python3 with venv, or $PYTHON; PyPI reachable)
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=lib.sh
. .ci/lib.sh

venv=target/ci-openai-venv
make_venv "$venv"
"$venv/bin/python" -m pip install -q --disable-pip-version-check openai==3.57.0

bash .ci/build-native.sh  # target/release/kvcore
logs=()
pids=()
trap 'kill "${pids[@]}" 2>/dev/null || true; rm -f "${logs[@]}"' EXIT
# start ARGS...: a `kvcore serve smollm2` on a port the OS picks; sets $url, $pid, $log.
start() {
    log=$(mktemp)
    logs+=("$log")
    target/release/kvcore serve smollm2 --port 0 -t 2 "$@" 2>"$log" &
    pid=$!
    pids+=("$pid")
    url=
    for _ in $(seq 600); do
        url=$(grep -o 'listening on http://[0-9.:]*' "$log" | sed 's/listening on //' || true)
        [ -n "$url" ] && return 0
        kill -0 "$pid" 2>/dev/null || { cat "$log"; echo "kvcore serve exited" >&2; exit 1; }
        sleep 0.1
    done
    cat "$log"; echo "kvcore serve did not start" >&2; exit 1
}
# A second server that asks for an API key (the client test's 401s).
key=$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')
keyfile=$(mktemp)
logs+=("$keyfile")
echo "$key" >"$keyfile"
start --api-key-file "$keyfile"
keyed_url=$url
keyed_pid=$pid
start
echo "server at $url"
"$venv/bin/python" server/tests/openai_client.py "$url" ../shared/reference/smollm2-135m-instruct-q4_1/logits.json \
    "$keyed_url" "$key"
kill -TERM "$keyed_pid"
wait "$keyed_pid" || { echo "the keyed kvcore serve exited with $? after SIGTERM" >&2; exit 1; }
# Careless and hostile clients (issue 50): timeouts, shutdown, error objects, admission,
# /health under large prompts, /metrics accounting; each against servers it starts.
python3 server/tests/hostile_clients.py target/release/kvcore smollm2
# The load target: serve_load.rs's 32 clients with disconnects plus 20 slowloris
# connections, /health p99, no KV block leaked, exit after SIGTERM (~30 s).
python3 server/tests/load_hostile.py target/release/kvcore smollm2
# The prefix cache's Redis tier (issue 51): two replicas sharing one Redis server.
if ! command -v redis-server >/dev/null; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server
fi
python3 server/tests/tier_redis.py target/release/kvcore smollm2 "$(command -v redis-server)"
# Three replicas behind the SGLang Model Gateway (issue 51): cache-aware routing over disk
# tiers with a restart in the middle, then round robin over one Redis tier (~2 min).
smg_venv=target/ci-smg-venv
make_venv "$smg_venv"
"$smg_venv/bin/python" -m pip install -q --disable-pip-version-check smg==1.13.0
python3 server/tests/gateway_smg.py target/release/kvcore smollm2 "$smg_venv/bin/smg" "$(command -v redis-server)"
# The README's snippets, against this server.
readme=target/ci-readme
mkdir -p "$readme"
awk '/<!-- ci: readme-curl.sh -->/ {on = 1; next} on && /^```sh$/ {inside = 1; next}
     inside && /^```$/ {exit} inside {print}' README.md | sed "s|http://127.0.0.1:8080|$url|g" >"$readme/curl.sh"
awk '/<!-- ci: readme-openai.py -->/ {on = 1; next} on && /^```python$/ {inside = 1; next}
     inside && /^```$/ {exit} inside {print}' README.md | sed "s|http://127.0.0.1:8080|$url|g" >"$readme/readme_openai.py"
[ -s "$readme/curl.sh" ] && [ -s "$readme/readme_openai.py" ] || { echo "README lacks the serve snippets" >&2; exit 1; }
bash -euo pipefail "$readme/curl.sh" | tee "$readme/curl.out"
grep -q '"object":"chat.completion"' "$readme/curl.out"
grep -q '^data: \[DONE\]' "$readme/curl.out"
grep -q '^kvcore_prefix_cache_hit_rate ' "$readme/curl.out"
"$venv/bin/python" "$readme/readme_openai.py" | tee "$readme/readme_openai.out"
grep -q "Paris" "$readme/readme_openai.out"

kill -TERM "$pid"
status=0
wait "$pid" || status=$?
cat "$log"
[ "$status" -eq 0 ] || { echo "kvcore serve exited with $status after SIGTERM" >&2; exit 1; }
echo "kvcore serve exited 0 after SIGTERM"
