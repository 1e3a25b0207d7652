"""`kvcore serve --kv-tier redis://…` (issue 51): two replicas sharing one Redis server
and one secret file share their prefixes. A conversation's first turn runs on replica A;
its second turn, sent to replica B, takes the first turn's blocks from Redis
(`cached_tokens`, `kvcore_kv_tier_hits_total`) and answers as A answers it; a replica
with another secret shares nothing; Redis holds only records under kvcore's prefix.

Usage: python3 tier_redis.py KVCORE_BINARY MODEL REDIS_SERVER_BINARY
"""

import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.request

sys.path.insert(0, os.path.dirname(__file__))
import kvserve  # noqa: E402

check = kvserve.check


def replica(binary, model, redis_url, secret):
    return kvserve.Replica(binary, model, "-t", "1", "--kv-budget", "128M",
                           "--kv-tier", redis_url, "--kv-tier-secret-file", secret)


def chat(replica, messages):
    body = json.dumps({"model": "kvcore", "messages": messages, "max_tokens": 24,
                       "temperature": 0}).encode()
    req = urllib.request.Request(replica.url + "/v1/chat/completions", body,
                                 {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=300) as r:
        return json.load(r)


SYSTEM = ("You are a careful assistant for a public library. " * 3 +
          "Members may borrow up to twelve items at a time, for three weeks, renewable twice "
          "unless someone else has reserved the item. Late fees are ten cents a day per item, "
          "capped at five dollars. The library opens at nine on weekdays and at ten on "
          "weekends. ") * 4


def main():
    binary, model, redis_server = sys.argv[1:4]
    work = tempfile.mkdtemp(prefix="kvcore-tier-redis-")
    redis = kvserve.Redis(redis_server, work)
    port = redis.port
    try:
        url = redis.url
        secret = os.path.join(work, "tier.key")
        a = replica(binary, model, url, secret)
        b = replica(binary, model, url, secret)
        check(os.stat(secret).st_mode & 0o777 == 0o600, "the secret file is created with mode 0600")
        turn1 = [{"role": "system", "content": SYSTEM},
                 {"role": "user", "content": "How many items may I borrow, and for how long?"}]
        r1 = chat(a, turn1)
        n1 = r1["usage"]["prompt_tokens"]
        # Wait for A's blocks to reach Redis (written off the decode thread).
        deadline = time.time() + 60
        while time.time() < deadline and not a.metric("kvcore_kv_tier_written_bytes_total"):
            time.sleep(0.2)
        check(a.metric("kvcore_kv_tier_written_bytes_total") > 0, "replica A wrote its blocks to Redis")
        time.sleep(0.5)
        turn2 = turn1 + [{"role": "assistant", "content": r1["choices"][0]["message"]["content"]},
                         {"role": "user", "content": "And what are the late fees?"}]
        r2b = chat(b, turn2)
        cached = r2b["usage"]["prompt_tokens_details"]["cached_tokens"]
        full = n1 // 64 * 64
        check(cached >= 0.9 * full and cached >= 64,
              f"replica B took turn 1's blocks from Redis: {cached} cached of turn 1's {n1} tokens")
        check(b.metric("kvcore_kv_tier_hits_total") >= full // 64 - 1,
              f"B's tier hits: {b.metric('kvcore_kv_tier_hits_total')}")
        r2a = chat(a, turn2)
        check(r2a["choices"][0]["message"]["content"] == r2b["choices"][0]["message"]["content"],
              "B answers turn 2 as A does (greedy)")
        check(a.metric("kvcore_kv_tier_rejected_total") == 0 and
              b.metric("kvcore_kv_tier_rejected_total") == 0, "no record rejected")
        # Another deployment (another secret) on the same Redis shares nothing.
        other = replica(binary, model, url, os.path.join(work, "other.key"))
        r = chat(other, turn2)
        check(r["usage"]["prompt_tokens_details"]["cached_tokens"] == 0,
              "a replica with another secret finds nothing")
        check(other.metric("kvcore_kv_tier_hits_total") == 0, "  and has no tier hits")
        keys = subprocess.run(
            ["redis-cli", "-p", str(port), "--scan"], capture_output=True, text=True).stdout.split()
        check(keys and all(k.startswith("kvcore:kv:") for k in keys),
              f"Redis holds {len(keys)} records, all under kvcore:kv:")
        for r in (a, b, other):
            check(r.stop() == 0, "a replica exits 0 after SIGTERM")
    finally:
        redis.stop()
    kvserve.finish()


if __name__ == "__main__":
    main()
