"""A small client kit for `kvcore serve`, shared by the server's Python tests and the
serving benchmarks: start and stop replicas, a Redis server and the `smg` gateway on
loopback, stream a request and time its first token, read `/metrics`.

Standard library only (the tests run with the system python3).
"""

import json
import queue
import re
import socket
import statistics
import subprocess
import sys
import threading
import time
import urllib.request


FAILURES = []


def check(cond, what):
    """A test's check: printed, and remembered when it fails (see `finish`)."""
    print(("ok   " if cond else "FAIL ") + what, flush=True)
    if not cond:
        FAILURES.append(what)


def finish():
    """Exits 1 when a check failed."""
    if FAILURES:
        print(f"{len(FAILURES)} checks failed", file=sys.stderr)
        sys.exit(1)
    print("all checks passed")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(port, seconds=60):
    deadline = time.time() + seconds
    while time.time() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.1)
    raise SystemExit(f"nothing listens on port {port} after {seconds} s")


def get_json(url, timeout=30):
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return json.load(r)


def metric(base, name):
    """One unlabelled sample of `/metrics` (None when absent)."""
    with urllib.request.urlopen(base + "/metrics", timeout=30) as r:
        for line in r.read().decode().splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
    return None


class Replica:
    """`kvcore serve MODEL --port PORT ARGS...`; PORT 0 lets the OS pick (then `url` is
    read from the log). `restart()` starts the same command again on the same port."""

    def __init__(self, binary, model, *args, port=0):
        self.cmd = [binary, "serve", model, *args]
        self.port = port
        self.log = []
        self.start()

    def start(self):
        self.log = []
        self.proc = subprocess.Popen(
            self.cmd + ["--port", str(self.port)],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
            text=True)
        self.url = None
        ready = threading.Event()

        def read():
            for line in self.proc.stderr:
                self.log.append(line)
                m = re.search(r"listening on (http://[0-9.]+:\d+)", line)
                if m:
                    self.url = m.group(1)
                    ready.set()
            ready.set()
        threading.Thread(target=read, daemon=True).start()
        ready.wait(180)
        if self.url is None:
            raise SystemExit("kvcore serve did not start:\n" + "".join(self.log))

    def metric(self, name):
        return metric(self.url, name)

    def stop(self, sig="term", timeout=60):
        """Stops the replica (SIGTERM: it drains; "kill": SIGKILL); returns its status."""
        if sig == "kill":
            self.proc.kill()
        else:
            self.proc.terminate()
        return self.proc.wait(timeout)

    def restart(self):
        self.stop()
        self.start()


class Redis:
    """A throwaway `redis-server` on a loopback port, without persistence."""

    def __init__(self, server_binary, workdir, maxmemory="512mb"):
        self.port = free_port()
        self.proc = subprocess.Popen(
            [server_binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--maxmemory", maxmemory, "--maxmemory-policy",
             "allkeys-lru", "--dir", workdir],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_port(self.port)
        self.url = f"redis://127.0.0.1:{self.port}"

    def stop(self):
        self.proc.terminate()
        self.proc.wait(10)


class Gateway:
    """The SGLang Model Gateway (`smg launch`, PyPI `smg`) in front of `workers`, with the
    thresholds docs/scale-out.md recommends for kvcore replicas."""

    def __init__(self, smg_binary, workers, policy, parallel, logfile, cache_threshold=0.5):
        self.port = free_port()
        args = [smg_binary, "launch", "--host", "127.0.0.1", "--port", str(self.port),
                "--worker-urls", *workers, "--policy", policy,
                "--prometheus-port", str(free_port()), "--log-level", "warn",
                "--health-check-interval-secs", "1"]
        if policy == "cache_aware":
            args += ["--cache-threshold", str(cache_threshold),
                     "--balance-abs-threshold", str(parallel)]
        self.log = open(logfile, "w")
        self.proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=self.log,
                                     stderr=subprocess.STDOUT)
        wait_port(self.port)
        self.url = f"http://127.0.0.1:{self.port}"
        # Ready once every worker has passed the gateway's health check.
        deadline = time.time() + 120
        while time.time() < deadline:
            try:
                if get_json(self.url + "/v1/models", 5).get("data"):
                    return
            except OSError:
                pass
            time.sleep(0.5)
        raise SystemExit("the gateway lists no model; its log: " + logfile)

    def stop(self):
        self.proc.terminate()
        self.proc.wait(30)
        self.log.close()


def stream(base, path, body, timeout=600):
    """POSTs `body` with `stream: true` to `base + path`; returns (seconds to the first
    text, usage, the whole text)."""
    body = dict(body, stream=True, stream_options={"include_usage": True})
    req = urllib.request.Request(base + path, json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    start = time.perf_counter()
    first, usage, text = None, None, []
    with urllib.request.urlopen(req, timeout=timeout) as r:
        for line in r:
            line = line.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk.get("usage"):
                usage = chunk["usage"]
            for c in chunk.get("choices", []):
                piece = c.get("text") if "text" in c else (c.get("delta") or {}).get("content")
                if piece:
                    text.append(piece)
                    if first is None:
                        first = time.perf_counter() - start
    if first is None:
        first = time.perf_counter() - start
    return first, usage, "".join(text)


# A multi-turn chat workload: every conversation has the same system prompt (about 150
# tokens) and a unique first user turn (about 330 tokens: a passage of Debian's GPL-3
# text); later turns ask a short question each, with the previous answers in the history.
QUESTIONS = ["Summarise that in one sentence.", "Which word in it matters most, and why?",
             "Say it again for a child.", "What would a lawyer ask next?",
             "Give it a title.", "What is left out?"]


class Conversations:
    def __init__(self, n, model_id, max_tokens=32):
        words = open("/usr/share/common-licenses/GPL-3").read().split()
        system = ("You are the help desk of a software foundation. Answer briefly, quote the "
                  "licence where it helps, and never give legal advice. ") + " ".join(words[:110])
        self.model_id, self.max_tokens = model_id, max_tokens
        self.messages = []
        for i in range(n):
            at = 200 + (i * 97) % (len(words) - 500)
            first = (f"Conversation {i}. Please read this passage:\n"
                     f"{' '.join(words[at:at + 240])}\nWhat does it say, in plain words?")
            self.messages.append([{"role": "system", "content": system},
                                  {"role": "user", "content": first}])
        self.turn = [1] * n
        self.rows, self.errors = [], []
        self.lock = threading.Lock()

    def _one(self, base, i):
        """Sends conversation i's next turn; False when it failed (counted in errors)."""
        body = {"model": self.model_id, "messages": self.messages[i],
                "max_tokens": self.max_tokens, "temperature": 0}
        t0 = time.perf_counter()
        try:
            ttft, usage, text = stream(base, "/v1/chat/completions", body)
        except Exception as e:  # an error is a finding: counted, the conversation ends
            with self.lock:
                self.errors.append(f"conversation {i} turn {self.turn[i]}: {e}")
            return False
        total = time.perf_counter() - t0
        done = usage["completion_tokens"]
        with self.lock:
            self.rows.append({
                "conversation": i, "turn": self.turn[i], "ttft": ttft,
                "prompt": usage["prompt_tokens"], "completion": done,
                "cached": usage["prompt_tokens_details"]["cached_tokens"],
                "decode_tok_s": (done - 1) / (total - ttft)
                if done > 1 and total > ttft else None,
            })
        turn = self.turn[i]
        self.messages[i] = self.messages[i] + [
            {"role": "assistant", "content": text},
            {"role": "user", "content": QUESTIONS[(i + turn) % len(QUESTIONS)]}]
        self.turn[i] = turn + 1
        return True

    def run(self, base, clients, turns):
        """`clients` threads take whole conversations and send their next `turns` turns,
        one after another. Returns the wall time in seconds."""
        todo = queue.Queue()
        for i in range(len(self.messages)):
            todo.put(i)

        def client():
            while True:
                try:
                    i = todo.get_nowait()
                except queue.Empty:
                    return
                for _ in range(turns):
                    if not self._one(base, i):
                        break

        threads = [threading.Thread(target=client) for _ in range(clients)]
        t0 = time.perf_counter()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return time.perf_counter() - t0

    def summary(self, replicas, turns=None):
        """Of turns 2.. (or of `turns`): the fraction of prompt tokens cached, the cached
        share of each turn's prefix (the turn before it, prompt and answer: at most the
        whole blocks of it), p50 TTFT; errors, replica shares, the median decode rate and
        the tier counters summed over `replicas`."""
        later = [r for r in self.rows if (r["turn"] in turns if turns else r["turn"] >= 2)]
        first = [r for r in self.rows if r["turn"] == 1]
        requests = [r.metric("kvcore_requests_total") or 0 for r in replicas]
        tier = {}
        for name in ("hits", "misses", "rejected", "read_bytes", "written_bytes", "dropped",
                     "evicted", "errors"):
            values = [r.metric(f"kvcore_kv_tier_{name}_total") for r in replicas]
            if all(v is not None for v in values):
                tier[name] = sum(values)
        rates = [r["decode_tok_s"] for r in self.rows if r["decode_tok_s"]]
        med = statistics.median
        # A turn's prefix is the turn before it: its prompt and its answer.
        before = {(r["conversation"], r["turn"]): r["prompt"] + r["completion"] for r in self.rows}
        reuse = [(r["cached"], before[(r["conversation"], r["turn"] - 1)]) for r in later
                 if (r["conversation"], r["turn"] - 1) in before]
        return {
            "requests": len(self.rows), "client_errors": len(self.errors),
            "error_samples": self.errors[:3],
            "cached_fraction": sum(r["cached"] for r in later) / max(1, sum(r["prompt"] for r in later)),
            "prefix_reuse": sum(c for c, _ in reuse) / max(1, sum(p for _, p in reuse)),
            "cached_fraction_turn1": sum(r["cached"] for r in first) / max(1, sum(r["prompt"] for r in first)),
            "ttft_p50_ms": 1000 * med([r["ttft"] for r in later]) if later else None,
            "ttft_p50_turn1_ms": 1000 * med([r["ttft"] for r in first]) if first else None,
            "prompt_tokens_turn1_median": med([r["prompt"] for r in first]) if first else None,
            "decode_tok_s_median": med(rates) if rates else None,
            "replica_requests": requests,
            "replica_share_max_over_min": max(requests) / max(1, min(requests)),
            "tier_counters": tier,
        }
