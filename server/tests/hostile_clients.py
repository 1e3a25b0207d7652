"""`kvcore serve` under careless and hostile clients (issue 50), with raw TCP sockets
against real servers on loopback, each started here with the settings its check needs.

Usage: python3 hostile_clients.py KVCORE_BINARY MODEL [CHECK...]
Checks: timeouts (idle, slow head, slow body), a shutdown that always ends (half-sent
request, idle keep-alive, a stream nobody reads) and the 503 a keep-alive request gets
while draining, OpenAI error objects naming the field for every status, admission
without max_tokens, /health under large prompts, and the /metrics counters against the
requests sent.
"""

import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(__file__))
import kvserve  # noqa: E402

# The binary and model every Server runs (set from the command line, or by a script that
# imports these helpers).
BINARY, MODEL = None, None
FAILURES = kvserve.FAILURES
check = kvserve.check


class Server(kvserve.Replica):
    """`kvcore serve MODEL` on a port the OS picks (`-t 1` unless `extra` sets it), with
    raw-socket requests."""

    def __init__(self, *extra):
        threads = ["-t", "1"] if "-t" not in extra else []
        super().__init__(BINARY, MODEL, *threads, *extra)
        host, port = self.url.split("//", 1)[1].rsplit(":", 1)
        self.addr = (host, int(port))

    def connect(self, timeout=30):
        s = socket.create_connection(self.addr, timeout=timeout)
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return s

    def request(self, method, path, body=None, headers=None, timeout=120):
        """One request on a new connection: (status, headers, body bytes)."""
        s = self.connect(timeout)
        try:
            s.sendall(raw_request(method, path, body, headers))
            return read_response(s)
        finally:
            s.close()

    def post(self, path, obj):
        status, headers, body = self.request("POST", path, json.dumps(obj).encode())
        return status, headers, json.loads(body) if body else None

    def metrics(self):
        _, _, body = self.request("GET", "/metrics")
        out = {}
        for line in body.decode().splitlines():
            if line and not line.startswith("#"):
                k, v = line.split()
                out[k] = float(v)
        return out

    def term(self):
        """SIGTERM; seconds until the process exited, and its status."""
        t = time.monotonic()
        self.proc.send_signal(signal.SIGTERM)
        try:
            code = self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            code = self.proc.wait()
            return 60.0, code
        return time.monotonic() - t, code

    def stop(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


# A head declaring a body past the server's 2 MiB limit, without sending it: the declared
# length alone is refused, and a client still sending when the server answers and closes
# would race it (the unread bytes make the close a reset, which can drop the answer).
TOO_LONG = {"Content-Length": str(3 << 20)}


def raw_request(method, path, body=None, headers=None, keep_alive=False):
    h = {"Host": "x"}
    if body is not None:
        h["Content-Type"] = "application/json"
        h["Content-Length"] = str(len(body))
    if not keep_alive:
        h["Connection"] = "close"
    h.update(headers or {})
    head = f"{method} {path} HTTP/1.1\r\n" + "".join(f"{k}: {v}\r\n" for k, v in h.items())
    return head.encode() + b"\r\n" + (body or b"")


def read_response(s):
    """One response from `s` (Content-Length or chunked or to EOF)."""
    f = s.makefile("rb")
    line = f.readline()
    if not line:
        raise ConnectionError("closed without a response")
    status = int(line.split()[1])
    headers = {}
    while True:
        line = f.readline()
        if line in (b"\r\n", b""):
            break
        k, _, v = line.decode().partition(":")
        headers[k.strip().lower()] = v.strip()
    if "content-length" in headers:
        body = f.read(int(headers["content-length"]))
    elif headers.get("transfer-encoding") == "chunked":
        body = b""
        while True:
            n = int(f.readline().strip(), 16)
            if n == 0:
                f.readline()
                break
            body += f.read(n)
            f.readline()
    else:
        body = f.read()
    return status, headers, body


def closed_within(s, seconds):
    """Whether the server closes `s` (EOF or reset) within `seconds`; what it sent."""
    s.settimeout(seconds)
    got = b""
    try:
        while True:
            b = s.recv(4096)
            if not b:
                return True, got
            got += b
    except socket.timeout:
        return False, got
    except ConnectionResetError:
        return True, got


def is_error_object(status, headers, body, want_status, param=None):
    if status != want_status or not headers.get("content-type", "").startswith("application/json"):
        return False
    try:
        e = json.loads(body)["error"]
    except (ValueError, KeyError, TypeError):
        return False
    return isinstance(e.get("message"), str) and e.get("type") and (param is None or e.get("param") == param)


def chat(content="Say hello.", **extra):
    return {"messages": [{"role": "user", "content": content}], **extra}


def timeouts():
    srv = Server("--timeout-headers", "1", "--timeout-body", "1")
    try:
        idle = srv.connect()
        ok, _ = closed_within(idle, 4)
        check(ok, "an idle connection is closed after --timeout-headers")
        # A keep-alive connection idle after one request.
        ka = srv.connect()
        ka.sendall(raw_request("GET", "/health", keep_alive=True))
        status, _, _ = read_response(ka)
        ok, _ = closed_within(ka, 4)
        check(status == 200 and ok, "an idle keep-alive connection is closed after --timeout-headers")
        slow = srv.connect()
        t = time.monotonic()
        closed = False
        for b in raw_request("GET", "/health"):
            try:
                slow.sendall(bytes([b]))
            except OSError:
                closed = True
                break
            time.sleep(0.3)
            if time.monotonic() - t > 6:
                break
        if not closed:
            closed, _ = closed_within(slow, 3)
        check(closed and time.monotonic() - t < 8, "a head sent a byte at a time is cut off")
        body = json.dumps(chat(max_tokens=2)).encode()
        sb = srv.connect()
        sb.sendall(raw_request("POST", "/v1/chat/completions", body)[:-len(body)] + body[:5])
        t = time.monotonic()
        status, headers, rbody = read_response(sb)
        check(is_error_object(status, headers, rbody, 408) and time.monotonic() - t < 4,
              f"a body that stops arriving gets a 408 error object ({status} {rbody[:80]!r})")
        status, _, _ = srv.request("GET", "/health")
        check(status == 200, "the server still answers after the slow clients")
    finally:
        srv.stop()


def shutdown():
    # A half-sent request, an idle keep-alive connection and a stream nobody reads, all
    # at once; the timeouts are long so only the shutdown can end them.
    srv = Server("--timeout-headers", "60", "--timeout-body", "60", "--shutdown-timeout", "2")
    try:
        half = srv.connect()
        half.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Le")
        idle = srv.connect()
        idle.sendall(raw_request("GET", "/health", keep_alive=True))
        read_response(idle)
        unread = srv.connect()
        unread.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1024)
        unread.sendall(raw_request("POST", "/v1/chat/completions",
                                   json.dumps(chat("Write a long story.", max_tokens=2000, stream=True,
                                                   temperature=0)).encode()))
        time.sleep(1.5)
        took, code = srv.term()
        check(code == 0 and took < 2 + 2, f"SIGTERM with hostile clients: exit {code} after {took:.1f} s (--shutdown-timeout 2)")
    finally:
        srv.stop()
    # A keep-alive connection that sends a request while the server drains.
    srv = Server("--shutdown-timeout", "5")
    try:
        ka = srv.connect()
        ka.sendall(raw_request("GET", "/health", keep_alive=True))
        read_response(ka)
        running = srv.connect()
        running.sendall(raw_request("POST", "/v1/chat/completions",
                                    json.dumps(chat("Write a long story.", max_tokens=400, stream=True,
                                                    temperature=0)).encode()))
        running.recv(1)  # the stream started
        t = time.monotonic()
        srv.proc.send_signal(signal.SIGTERM)
        time.sleep(0.3)
        ka.sendall(raw_request("POST", "/v1/chat/completions",
                               json.dumps(chat(max_tokens=2)).encode(), keep_alive=True))
        status, headers, body = read_response(ka)
        check(is_error_object(status, headers, body, 503) and "retry-after" in headers
              and headers.get("connection") == "close",
              f"a keep-alive request while draining gets 503 with Retry-After ({status} {headers})")
        code = srv.proc.wait(30)
        took = time.monotonic() - t
        check(code == 0 and took < 5 + 2, f"draining ended: exit {code} after {took:.1f} s")
    finally:
        srv.stop()


def errors():
    srv = Server("-c", "256", "--timeout-body", "1")
    try:
        chat_path, text_path = "/v1/chat/completions", "/v1/completions"
        wrong = {
            "model": 5, "max_tokens": "ten", "max_completion_tokens": -1, "temperature": "hot",
            "top_p": [], "seed": "x", "stop": 3, "stream": "yes", "stream_options": 7,
            "n": "one", "presence_penalty": {}, "frequency_penalty": "f", "logprobs": None,
            "tools": 5, "echo": "no",
        }
        for field, value in wrong.items():
            if value is None:
                continue
            for path, base in ((chat_path, chat()), (text_path, {"prompt": "hi"})):
                status, _, v = srv.post(path, {**base, field: value})
                check(status == 400 and v["error"]["param"] == field,
                      f"{path} {field}={value!r}: 400 naming {field} ({v['error']['param'] if v else None})")
        # Each endpoint's own fields, and paths inside them.
        table = [
            (chat_path, {"messages": 5}, "messages"),
            (chat_path, {"messages": [{"role": "user", "content": "a"}, {"role": 3}]}, "messages[1].role"),
            (chat_path, {"messages": [{"role": "user", "content": "a"}, {"role": "user", "content": 5}]},
             "messages[1].content"),
            (chat_path, {"messages": [{"role": "user", "content": [{"type": 1}]}]}, "messages[0].content"),
            (chat_path, chat("word " * 400), "messages"),
            (text_path, {"prompt": 5}, "prompt"),
            (text_path, {"prompt": "word " * 400}, "prompt"),
            (text_path, {"prompt": ""}, "prompt"),
            (text_path, {"prompt": [1, 2, 999999]}, "prompt"),
            (chat_path, chat(max_tokens=1000), "max_tokens"),
            (chat_path, chat(max_completion_tokens=0), "max_completion_tokens"),
            (chat_path, chat(stream_options={"include_usage": 3}), "stream_options.include_usage"),
        ]
        for path, body, param in table:
            status, _, v = srv.post(path, body)
            got = v["error"]["param"] if v else None
            check(status == 400 and got == param, f"{path} {str(body)[:60]}: 400 naming {param} ({status}, {got})")
        cases = [
            ("GET", "/nowhere", None, {}, 404),
            ("PUT", chat_path, b"{}", {}, 405),
            ("GET", chat_path, None, {}, 405),
            ("POST", chat_path, b"{}", {"Content-Type": "text/plain"}, 415),
            ("POST", chat_path, b"", TOO_LONG, 413),
            ("GET", "/health", None, {"X-Big": "a" * (20 << 10)}, 431),
        ]
        for method, path, body, headers, want in cases:
            status, h, b = srv.request(method, path, body, headers)
            check(is_error_object(status, h, b, want), f"{method} {path}: {want} as an OpenAI error object ({status} {b[:60]!r})")
        # 408: a body that stops.
        s = srv.connect()
        s.sendall(raw_request("POST", chat_path, b"{" + b" " * 99)[:-95])
        status, h, b = read_response(s)
        check(is_error_object(status, h, b, 408), f"a stalled body: 408 as an OpenAI error object ({status})")
    finally:
        srv.stop()


def admission():
    err = subprocess.run([BINARY, "serve", MODEL, "--port", "0", "-t", "1", "-c", "2048", "--kv-budget", "64M"],
                         capture_output=True, text=True, timeout=120)
    check(err.returncode != 0 and "cannot hold one sequence of the whole context" in err.stderr,
          "a budget that cannot hold one full-context sequence is refused: " + err.stderr.strip()[-120:])
    srv = Server("-c", "160", "--kv-budget", "64M")
    try:
        line = "".join(srv.log)
        check("holds 7 sequences of the whole context (160 positions)" in line,
              "start-up says how many full-context sequences the budget holds")
        _, _, props = srv.request("GET", "/props")
        check(json.loads(props).get("kv_budget_full_context_sequences") == 7, "/props says it too")
        status, _, v = srv.post("/v1/completions", {"prompt": [1] * 100, "temperature": 0})
        check(status == 200 and v["choices"][0]["finish_reason"] == "length"
              and v["usage"]["completion_tokens"] == 160 - 100 + 1,
              f"without max_tokens: generated to the context's end, finish length ({status})")
    finally:
        srv.stop()


def responsiveness():
    srv = Server("--parallel", "2", "--queue", "16")
    try:
        big = json.dumps(chat("lorem ipsum dolor " * 110_000)).encode()  # ~1.9 MB
        done = []

        def send():
            try:
                done.append(srv.request("POST", "/v1/chat/completions", big)[0])
            except OSError as e:
                done.append(str(e))
        threads = [threading.Thread(target=send) for _ in range(8)]
        for t in threads:
            t.start()
        worst = 0.0
        time.sleep(0.2)
        while any(t.is_alive() for t in threads):
            t0 = time.monotonic()
            status, _, _ = srv.request("GET", "/health")
            worst = max(worst, time.monotonic() - t0)
            time.sleep(0.05)
        for t in threads:
            t.join()
        check(worst < 0.25 and all(d == 400 for d in done),
              f"/health under eight 1.9 MB prompts: worst {worst * 1000:.0f} ms; answers {done}")
    finally:
        srv.stop()


def accounting():
    srv = Server("--parallel", "3", "--queue", "1", "-c", "1024", "--kv-budget", "64M", "--timeout-body", "1")
    try:
        sent = {"ok": 0, "bad": 0, "rejected": 0, "cancelled": 0, "failed": 0}
        prompt_tokens = 0
        # Three long prompts that together outgrow the budget: one is requeued.
        lock = threading.Lock()
        results = []

        def long_one(i):
            body = {"prompt": [100 + i] + [28] * 659, "max_tokens": 300, "temperature": 0}
            r = srv.post("/v1/completions", body)
            with lock:
                results.append(r)
        threads = [threading.Thread(target=long_one, args=(i,)) for i in range(3)]
        for t in threads:
            t.start()
            time.sleep(0.05)
        # Beyond 3 running + 1 queued: 503s.
        time.sleep(0.5)
        small = [threading.Thread(target=lambda: results.append(
            srv.post("/v1/completions", {"prompt": [28], "max_tokens": 1}))) for _ in range(3)]
        for t in small:
            t.start()
        for t in small + threads:
            t.join()
        for status, _, v in results:
            if status == 200:
                sent["ok"] += 1
                prompt_tokens += v["usage"]["prompt_tokens"]
            elif status == 503 and "busy" in v["error"]["message"]:
                sent["rejected"] += 1
            elif status == 503:
                # Accepted, then failed for blocks (a long one: 660 prompt tokens).
                sent["failed"] += 1
                prompt_tokens += 660
            else:
                sent["bad"] += 1
        srv.post("/v1/completions", {"prompt": ""})
        srv.post("/v1/completions", {"temperature": 7, "prompt": "x"})
        sent["bad"] += 2
        # A client that goes away mid-stream: after its first token, so it was admitted
        # (the head alone comes before, and on a loaded machine a client that leaves
        # then can be gone before the scheduler takes the request).
        s = srv.connect()
        s.sendall(raw_request("POST", "/v1/completions", json.dumps(
            {"prompt": [28] * 5, "max_tokens": 500, "stream": True}).encode()))
        got = b""
        while b"data:" not in got:
            piece = s.recv(4096)
            if not piece:
                break
            got += piece
        s.close()
        sent["cancelled"] += 1
        # The refusals before any handler, one of each.
        refusals = [
            ("GET", "/nowhere", None, {}, 404),
            ("DELETE", "/v1/completions", None, {}, 405),
            ("POST", "/v1/completions", b"", TOO_LONG, 413),
            ("POST", "/v1/completions", b"{}", {"Content-Type": "text/plain"}, 415),
            ("GET", "/health", None, {"X-Big": "a" * (20 << 10)}, 431),
        ]
        answered = [srv.request(method, path, body, headers)[0] for method, path, body, headers, _ in refusals]
        stalled = srv.connect()
        stalled.sendall(raw_request("POST", "/v1/completions", b"{" + b" " * 99)[:-95])
        answered.append(read_response(stalled)[0])
        stalled.close()
        check(answered == [want for *_, want in refusals] + [408], f"one refusal of each status: {answered}")
        time.sleep(1.0)
        m = srv.metrics()
        by_status = {int(re.search(r'status="(\d+)"', k).group(1)): v for k, v in m.items()
                     if k.startswith("kvcore_http_error_responses_total{")}
        want = {400: sent["bad"], 401: 0, 404: 1, 405: 1, 408: 1, 413: 1, 415: 1, 431: 1, 500: 0,
                503: sent["rejected"] + sent["failed"]}
        check(by_status == want, f"kvcore_http_error_responses_total by status {by_status} == {want}")
        check(m["kvcore_requests_requeued_total"] >= 1, f"the long prompts were requeued ({m['kvcore_requests_requeued_total']})")
        check(m["kvcore_requests_total"] == sent["ok"] + sent["cancelled"] + sent["failed"],
              f"requests_total {m['kvcore_requests_total']} == {sent}")
        check(m["kvcore_requests_completed_total"] == sent["ok"], "completed_total")
        check(m["kvcore_requests_cancelled_total"] == sent["cancelled"], "cancelled_total")
        check(m["kvcore_requests_rejected_total"] == sent["rejected"] and sent["rejected"] >= 1,
              f"rejected_total {m['kvcore_requests_rejected_total']} == {sent['rejected']}")
        check(m["kvcore_requests_invalid_total"] == sent["bad"], "invalid_total")
        check(m["kvcore_requests_failed_total"] == sent["failed"], "failed_total")
        stream_prompt = 5
        check(m["kvcore_prompt_tokens_total"] == prompt_tokens + stream_prompt,
              f"prompt_tokens_total {m['kvcore_prompt_tokens_total']} == {prompt_tokens} + {stream_prompt}: a requeue is not counted twice")
        check(m["kvcore_running_sequences"] == 0 and m["kvcore_kv_pool_blocks_in_use"] == 0, "nothing left running")
    finally:
        srv.stop()


def threads():
    t = time.monotonic()
    r = subprocess.run([BINARY, "generate", MODEL, "-t", "1000", "-n", "4", "-p", "Hello", "--temp", "0"],
                       capture_output=True, text=True, timeout=300)
    took = time.monotonic() - t
    check(r.returncode == 0 and "--threads 1000 is more than the" in r.stderr and "using" in r.stderr
          and took < 30, f"generate -t 1000 is clamped to the cores and said so, in {took:.1f} s")
    srv = Server("-t", "1000")
    try:
        log = "".join(srv.log)
        check("--threads 1000 is more than the" in log and "(1000 threads" not in log,
              "serve -t 1000 is clamped too")
    finally:
        srv.stop()


def finish(what):
    """Exits 1 if a check failed."""
    if FAILURES:
        print(f"{len(FAILURES)} checks failed", file=sys.stderr)
        sys.exit(1)
    print(f"every {what} check passed")


if __name__ == "__main__":
    BINARY, MODEL = sys.argv[1], sys.argv[2]
    chosen = sys.argv[3:] or ["timeouts", "shutdown", "errors", "admission", "responsiveness", "accounting", "threads"]
    for test in [globals()[name] for name in chosen]:
        print(f"--- {test.__name__}", flush=True)
        test()
    finish("hostile-client")
