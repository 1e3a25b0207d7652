"""Replicas of `kvcore serve` behind the SGLang Model Gateway (`smg`, PyPI), issue 51's
routing, sharing and cost targets.

Usage:
  python3 benches/gateway.py KVCORE_BINARY --smg PATH/TO/smg [--policy cache_aware]
      [--tier none|disk|redis] [--redis-server PATH] [--conversations 64] [--turns 4]
      [--clients 8] [--replicas 3] [--kv-budget 512M] [--max-tokens 32]

The workload: every conversation has the same system prompt (about 150 tokens) and a
unique first user turn (about 330 tokens: a numbered passage of Debian's GPL-3 text);
turns 2.. ask a short question each, with the assistant's previous answers in the history.
`--clients` threads each run whole conversations, one turn after another, streamed and
greedy. Each replica runs with `-t 1`.

Prints one JSON object: for turns 2.. the fraction of prompt tokens served from the cache
(`cached_tokens`, which counts tier hits too) and the median time to first token; client
errors; each replica's share of requests (from its /metrics) and the largest/smallest
ratio; the median decode rate of the requests (tokens after the first per second after
the first); the tier counters summed over the replicas.
"""

import argparse
import json
import os
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "server", "tests"))
import kvserve  # noqa: E402

def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("binary")
    ap.add_argument("model", nargs="?", default="smollm2")
    ap.add_argument("--smg", required=True)
    ap.add_argument("--policy", default="cache_aware")
    ap.add_argument("--tier", choices=["none", "disk", "redis"], default="none")
    ap.add_argument("--redis-server", default="redis-server")
    ap.add_argument("--conversations", type=int, default=64)
    ap.add_argument("--turns", type=int, default=4)
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--replicas", type=int, default=3)
    ap.add_argument("--parallel", type=int, default=4)
    ap.add_argument("--kv-budget", default="512M")
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--cache-threshold", type=float, default=0.5)
    args = ap.parse_args()
    work = tempfile.mkdtemp(prefix="kvcore-gateway-")
    redis = kvserve.Redis(args.redis_server, work) if args.tier == "redis" else None
    replicas = []
    gateway = None
    try:
        for i in range(args.replicas):
            extra = ["-t", "1", "--kv-budget", args.kv_budget, "--parallel", str(args.parallel)]
            if args.tier == "disk":
                extra += ["--kv-tier", os.path.join(work, f"tier{i}")]
            elif redis:
                extra += ["--kv-tier", redis.url, "--kv-tier-secret-file", os.path.join(work, "secret")]
            replicas.append(kvserve.Replica(args.binary, args.model, *extra))
        model_id = kvserve.get_json(replicas[0].url + "/v1/models")["data"][0]["id"]
        gateway = kvserve.Gateway(args.smg, [r.url for r in replicas], args.policy,
                                  args.parallel, os.path.join(work, "smg.log"),
                                  args.cache_threshold)
        conversations = kvserve.Conversations(args.conversations, model_id, args.max_tokens)
        seconds = conversations.run(gateway.url, args.clients, args.turns)
        out = conversations.summary(replicas)
        out.update(policy=args.policy, tier=args.tier, conversations=args.conversations,
                   turns=args.turns, clients=args.clients, replicas=args.replicas,
                   seconds=seconds)
        print(json.dumps(out, indent=1))
    finally:
        if gateway:
            gateway.stop()
        for r in replicas:
            r.stop()
        if redis:
            redis.stop()


if __name__ == "__main__":
    main()
