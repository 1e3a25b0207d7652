"""The load target of issue 50 against one real `kvcore serve` on loopback: the load of
cli/tests/serve_load.rs (32 streaming clients send 96 chat requests sharing a ~300-token
system prompt, one in five disconnects mid-stream, a 503 is retried after a second) plus
20 slowloris connections (idle, a head byte at a time, a body byte at a time; each
reconnects when the server cuts it off) for the whole run, with /health sampled
throughout. Required: every well-behaved request completes (200, a stream ending in
[DONE]), p99 /health latency below 50 ms, every KV block free afterwards, and exit 0
within --shutdown-timeout + 2 s of a SIGTERM sent while the slowloris connections and
unfinished streams are open. Prints the measurements.

Usage: python3 load_hostile.py KVCORE_BINARY MODEL [--threads N] [--requests N]
"""

import argparse
import json
import os
import threading
import time

import hostile_clients as hc
from hostile_clients import check, raw_request, read_response

CLIENTS = 32
SLOWLORIS = 20
MAX_TOKENS = 24
SHUTDOWN_TIMEOUT = 3
with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "load_questions.txt")) as f:
    QUESTIONS = f.read().splitlines()  # serve_load.rs's, asked in turn


def system_prompt():
    """About 300 tokens of a text every Debian system ships (base-files), as serve_load.rs."""
    with open("/usr/share/common-licenses/Apache-2.0") as f:
        return " ".join(f.read().split()[:220])


def body(system, q, max_tokens=MAX_TOKENS):
    return json.dumps({
        "messages": [{"role": "system", "content": system}, {"role": "user", "content": QUESTIONS[q]}],
        "max_tokens": max_tokens, "temperature": 0, "stream": True,
    }).encode()


def percentile(sorted_values, p):
    return sorted_values[round((len(sorted_values) - 1) * p)]


class Slowloris:
    """One hostile connection of `kind` (idle, head, body), reconnecting whenever the
    server closes it, until `stop` is set; counts the cut-offs and 408s."""

    def __init__(self, srv, kind, stop):
        self.srv, self.kind, self.stop = srv, kind, stop
        self.cut, self.timeouts_408, self.open = 0, 0, False

    def run(self):
        request = raw_request("POST", "/v1/chat/completions", json.dumps(hc.chat(max_tokens=2)).encode())
        head_len = request.index(b"\r\n\r\n") + 4
        drip = {"idle": b"", "head": request, "body": request[head_len:]}[self.kind]
        while not self.stop.is_set():
            try:
                s = self.srv.connect(timeout=60)
            except OSError:
                self.stop.wait(0.1)
                continue
            self.open = True
            try:
                if self.kind == "body":
                    s.sendall(request[:head_len])
                closed, got = False, b""
                for b in drip:
                    if self.stop.is_set() or closed:
                        break
                    s.sendall(bytes([b]))
                    closed, got = hc.closed_within(s, 1.0)
                while not (self.stop.is_set() or closed):
                    closed, got = hc.closed_within(s, 0.5)
            except OSError:
                closed, got = True, b""
            finally:
                s.close()
                self.open = False
            if closed:
                self.cut += 1
                self.timeouts_408 += got.startswith(b"HTTP/1.1 408")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("binary")
    ap.add_argument("model")
    ap.add_argument("--threads", default="2")
    ap.add_argument("--requests", type=int, default=96)
    args = ap.parse_args()
    hc.BINARY, hc.MODEL = args.binary, args.model
    srv = hc.Server("-t", args.threads, "--parallel", "8", "--queue", "64", "--activations", "q8",
                    "--kv-budget", "256M", "--timeout-headers", "3", "--timeout-body", "5",
                    "--shutdown-timeout", str(SHUTDOWN_TIMEOUT))
    system = system_prompt()
    stop, stop_health = threading.Event(), threading.Event()
    lock = threading.Lock()
    health, failures = [], []
    tally = {"completed": 0, "disconnected": 0, "retried_503": 0}
    try:
        # The shared prompt once, so the load starts with it cached as serve_load.rs's does.
        status, _, b = srv.request("POST", "/v1/chat/completions", body(system, 0))
        check(status == 200 and b"data: [DONE]" in b, f"a first request alone ({status})")

        def sample_health():
            while not stop_health.is_set():
                t0 = time.monotonic()
                try:
                    status, _, _ = srv.request("GET", "/health", timeout=10)
                except OSError as e:
                    status = str(e)
                took = time.monotonic() - t0
                with lock:
                    health.append(took)
                    if status != 200:
                        failures.append(f"/health answered {status}")
                stop_health.wait(0.05)

        kinds = ["idle"] * 7 + ["head"] * 7 + ["body"] * 6
        lorises = [Slowloris(srv, k, stop) for k in kinds]
        background = [threading.Thread(target=sample_health)] + [threading.Thread(target=l.run) for l in lorises]
        for t in background:
            t.start()
        time.sleep(1.0)  # every slowloris connection open before the load

        next_i = iter(range(args.requests))

        def client():
            while True:
                with lock:
                    i = next(next_i, None)
                if i is None:
                    return
                q, leave = i % len(QUESTIONS), i % 5 == 2
                while True:
                    s = srv.connect(timeout=120)
                    try:
                        s.sendall(raw_request("POST", "/v1/chat/completions", body(system, q)))
                        if leave:
                            f = s.makefile("rb")
                            status = int(f.readline().split()[1])
                            if status == 200:
                                while not f.readline().startswith(b"data: {"):
                                    pass
                                with lock:
                                    tally["disconnected"] += 1
                                break
                        else:
                            status, headers, rb = read_response(s)
                            if status == 200:
                                ok = rb.rstrip().endswith(b"data: [DONE]") and (
                                    b'"finish_reason":"length"' in rb or b'"finish_reason":"stop"' in rb)
                                with lock:
                                    if ok:
                                        tally["completed"] += 1
                                    else:
                                        failures.append(f"request {i}: a stream without its end: {rb[-200:]!r}")
                                break
                    except OSError as e:
                        with lock:
                            failures.append(f"request {i}: {e}")
                        break
                    finally:
                        s.close()
                    if status != 503:
                        with lock:
                            failures.append(f"request {i}: status {status}")
                        break
                    with lock:
                        tally["retried_503"] += 1
                    time.sleep(1.0)

        t_load = time.monotonic()
        clients = [threading.Thread(target=client) for _ in range(CLIENTS)]
        for t in clients:
            t.start()
        for t in clients:
            t.join()
        load_s = time.monotonic() - t_load

        # Every sequence and block freed (the prefix cache keeps idle blocks, evictable).
        freed, m = False, {}
        for _ in range(100):
            m = srv.metrics()
            if m["kvcore_running_sequences"] == 0 and m["kvcore_kv_pool_blocks_in_use"] == 0:
                freed = True
                break
            time.sleep(0.1)
        stop_health.set()
        background[0].join()
        with lock:
            samples = sorted(health)
        p50, p99, worst = percentile(samples, 0.5), percentile(samples, 0.99), samples[-1]

        # SIGTERM with the slowloris connections open and two streams nobody finishes.
        unfinished = []
        for q in range(2):
            s = srv.connect()
            s.sendall(raw_request("POST", "/v1/chat/completions", body(system, q, max_tokens=200)))
            s.recv(1)
            unfinished.append(s)
        open_lorises = sum(1 for l in lorises if l.open)
        took, code = srv.term()
        stop.set()
        for t in background:
            t.join()
        for s in unfinished:
            s.close()

        expected_leaving = sum(1 for i in range(args.requests) if i % 5 == 2)
        check(not failures, f"no failed request or /health ({len(failures)}: {failures[:5]})")
        check(tally["completed"] == args.requests - expected_leaving
              and tally["disconnected"] == expected_leaving,
              f"every well-behaved request completed: {tally['completed']} completed, "
              f"{tally['disconnected']} disconnected by design, {tally['retried_503']} 503s retried")
        check(p99 < 0.050, f"/health over {len(samples)} samples: p50 {p50 * 1000:.1f} ms, "
              f"p99 {p99 * 1000:.1f} ms, worst {worst * 1000:.1f} ms (p99 below 50 ms)")
        check(freed, f"no KV block leaked: {m['kvcore_kv_pool_blocks_in_use']:.0f} in use, "
              f"{m['kvcore_kv_pool_blocks']:.0f} alive of which {m['kvcore_kv_pool_blocks_cached_idle']:.0f} "
              f"cached idle, {m['kvcore_running_sequences']:.0f} sequences running")
        # A client that leaves after the first event may still see its request complete.
        check(m["kvcore_requests_completed_total"] + m["kvcore_requests_cancelled_total"] == 1 + args.requests
              and m["kvcore_requests_completed_total"] >= 1 + tally["completed"]
              and m["kvcore_requests_failed_total"] == 0,
              f"/metrics: {m['kvcore_requests_completed_total']:.0f} completed, "
              f"{m['kvcore_requests_cancelled_total']:.0f} cancelled, {m['kvcore_requests_failed_total']:.0f} failed, "
              f"{m['kvcore_requests_rejected_total']:.0f} rejected")
        cut = sum(l.cut for l in lorises)
        got_408 = sum(l.timeouts_408 for l in lorises)
        check(cut >= SLOWLORIS and got_408 >= 1,
              f"the slowloris connections were cut off {cut} times ({got_408} with a 408)")
        check(code == 0 and took < SHUTDOWN_TIMEOUT + 2,
              f"SIGTERM with {open_lorises} slowloris connections and 2 unfinished streams open: "
              f"exit {code} after {took:.2f} s (--shutdown-timeout {SHUTDOWN_TIMEOUT})")
        print(f"load: {args.requests} requests by {CLIENTS} clients + {SLOWLORIS} slowloris in {load_s:.1f} s "
              f"({args.requests / load_s:.2f} requests/s), -t {args.threads}", flush=True)
    finally:
        stop.set()
        stop_health.set()
        srv.stop()
    hc.finish("load")


if __name__ == "__main__":
    main()
