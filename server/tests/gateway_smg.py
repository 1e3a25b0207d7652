"""Three `kvcore serve` replicas behind the SGLang Model Gateway (`smg`), issue 51's CI:

1. Disk tiers, `--policy cache_aware`: a multi-turn workload; every replica serves, the
   gateway keeps conversations where their prefix is (turn 2's prompts mostly cached);
   then every replica is restarted on its tier directory (SIGTERM, same port) and turn 3
   takes its prefixes from the tiers: cached again, tier hits on every replica, nothing
   rejected, no client error.
2. One Redis tier shared by the replicas, `--policy round_robin`: turns hop between
   replicas, and still find their prefixes (written by whichever replica served the turn
   before).

Usage: python3 gateway_smg.py KVCORE_BINARY MODEL SMG_BINARY REDIS_SERVER_BINARY
"""

import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(__file__))
import kvserve  # noqa: E402

check = kvserve.check


def replicas(binary, model, tier_args):
    out = []
    for i in range(3):
        args = ["-t", "1", "--kv-budget", "256M", "--parallel", "2", *tier_args(i)]
        out.append(kvserve.Replica(binary, model, *args, port=kvserve.free_port()))
    return out


def wait_healthy(replicas, seconds=60):
    """Until the gateway answers a request again after a restart (its health checks run
    every second)."""
    deadline = time.time() + seconds
    while time.time() < deadline:
        try:
            if all(kvserve.get_json(r.url + "/health", 5) is not None for r in replicas):
                time.sleep(2.5)  # two of the gateway's health checks
                return
        except OSError:
            pass
        time.sleep(0.2)


def disk_phase(binary, model, smg, work):
    print("-- disk tiers, cache_aware, a restart between turns 2 and 3")
    reps = replicas(binary, model, lambda i: ["--kv-tier", os.path.join(work, f"tier{i}")])
    gw = kvserve.Gateway(smg, [r.url for r in reps], "cache_aware", 2,
                         os.path.join(work, "smg-disk.log"))
    try:
        model_id = kvserve.get_json(reps[0].url + "/v1/models")["data"][0]["id"]
        conv = kvserve.Conversations(6, model_id, max_tokens=16)
        conv.run(gw.url, 3, 2)
        s = conv.summary(reps, turns={2})
        check(s["client_errors"] == 0, f"no client error in turns 1-2 {s['error_samples']}")
        check(min(s["replica_requests"]) >= 1, f"every replica serves: {s['replica_requests']}")
        check(s["cached_fraction"] >= 0.85,
              f"turn 2 stays where its prefix is: cached fraction {s['cached_fraction']:.3f}")
        # Every replica's blocks reach its tier before the restart (written off the
        # decode thread); SIGTERM drains the writes too.
        for r in reps:
            status = r.stop()
            check(status == 0, f"a replica exits 0 after SIGTERM ({status})")
        for r in reps:
            r.start()
        wait_healthy(reps)
        conv.run(gw.url, 3, 1)
        s = conv.summary(reps, turns={3})
        check(s["client_errors"] == 0, f"no client error after the restart {s['error_samples']}")
        check(s["cached_fraction"] >= 0.85,
              f"turn 3 after the restart comes from the tiers: cached fraction {s['cached_fraction']:.3f}")
        hits = [r.metric("kvcore_kv_tier_hits_total") for r in reps]
        check(sum(hits) > 0 and sum(1 for h in hits if h > 0) >= 2,
              f"tier hits after the restart on the replicas: {hits}")
        check(s["tier_counters"].get("rejected") == 0, "no tier record rejected")
    finally:
        gw.stop()
        for r in reps:
            r.stop()


def redis_phase(binary, model, smg, redis_server, work):
    print("-- one Redis tier, round_robin")
    redis = kvserve.Redis(redis_server, work)
    secret = os.path.join(work, "secret")
    reps = replicas(binary, model,
                    lambda i: ["--kv-tier", redis.url, "--kv-tier-secret-file", secret])
    gw = kvserve.Gateway(smg, [r.url for r in reps], "round_robin", 2,
                         os.path.join(work, "smg-redis.log"))
    try:
        model_id = kvserve.get_json(reps[0].url + "/v1/models")["data"][0]["id"]
        # Two conversations, one request at a time: round robin sends every turn to
        # another replica than the conversation's turn before (A B | C A | B C).
        conv = kvserve.Conversations(2, model_id, max_tokens=16)
        for _ in range(3):
            conv.run(gw.url, 1, 1)
            time.sleep(1)  # the turn's blocks reach Redis before the next turn asks
        s = conv.summary(reps)
        check(s["client_errors"] == 0, f"no client error {s['error_samples']}")
        check(s["replica_requests"] == [2, 2, 2], f"round robin spreads: {s['replica_requests']}")
        check(s["cached_fraction"] >= 0.85,
              f"turns 2-3 find their prefix whichever replica serves them: "
              f"cached fraction {s['cached_fraction']:.3f}")
        check(s["tier_counters"].get("hits", 0) > 0 and s["tier_counters"].get("rejected") == 0,
              f"Redis tier hits, nothing rejected: {s['tier_counters']}")
    finally:
        gw.stop()
        for r in reps:
            r.stop()
        redis.stop()


def main():
    binary, model, smg, redis_server = sys.argv[1:5]
    work = tempfile.mkdtemp(prefix="kvcore-gateway-")
    disk_phase(binary, model, smg, work)
    redis_phase(binary, model, smg, redis_server, work)
    kvserve.finish()


if __name__ == "__main__":
    main()
