"""Greedy requests to one gateway, timed; prints one JSON object. Run inside the gateway's namespace:

    python netns_client.py --gateway 127.0.0.1:PORT --ca ca.pem --prompts-json '[...]' --max-tokens N [--no-speculation]
        [--draft-length K]

Besides outputs and timings it reports the draft lengths the gateway chose: mean k over all rounds, over
speculative rounds, and the share of plain (k = 0) rounds.

The token comes from TANDEM_TOKEN. A warm-up request first, then each prompt once (a bounded loop).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import grpc  # noqa: E402

from tandem.pb import gateway_grpc, gateway_pb2  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--gateway", required=True)
    p.add_argument("--ca", required=True)
    p.add_argument("--prompts-json", required=True)
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--draft-length", type=int, default=0)
    p.add_argument("--chat", action="store_true")
    p.add_argument("--no-speculation", action="store_true")
    args = p.parse_args()
    metadata = (("authorization", f"Bearer {os.environ['TANDEM_TOKEN']}"),)
    creds = grpc.ssl_channel_credentials(Path(args.ca).read_bytes())
    prompts = json.loads(args.prompts_json)
    out = {"outputs": [], "tokens": 0, "seconds": 0.0, "rounds": 0, "accepted": 0, "speculative": [],
           "fallback": []}
    ks: list[int] = []                                       # the k of every round (0: a plain step)
    fetched: list[int] = []                                  # the k of every round that called the drafter
    with grpc.secure_channel(args.gateway, creds) as channel:
        stub = gateway_grpc.GatewayStub(channel)

        def call(prompt, n):
            return stub.Generate(gateway_pb2.GenerateRequest(
                prompt=prompt, max_tokens=n, ignore_eos=True, chat=args.chat, draft_length=args.draft_length,
                no_speculation=args.no_speculation), timeout=600, metadata=metadata)

        call(prompts[0], 8)                                   # warm-up: connections, TLS, first allocations
        for prompt in prompts:
            t0 = time.perf_counter()
            reply = call(prompt, args.max_tokens)
            out["seconds"] += time.perf_counter() - t0
            out["tokens"] += len(reply.token_ids)
            out["outputs"].append(list(reply.token_ids))
            out["rounds"] += reply.stats.rounds
            out["accepted"] += reply.stats.accepted
            out["speculative"].append(reply.stats.speculative)
            out["fallback"].append(reply.stats.fallback_reason)
            ks += [r.k for r in reply.stats.round_stats]
            # blocks the drafter drafted (draft time > 0); blocks prompt lookup supplied whole are copied by
            # the gateway (no drafter call, draft_ms 0) and do not cross the link
            calls = [r for r in reply.stats.round_stats if r.k > 0 and r.draft_ms > 0]
            fetched += [r.k for r in calls]
            out.setdefault("fetched_blocks", []).extend(f"{r.k}:{r.k_reason}" for r in calls)
    drafted = [k for k in ks if k > 0]
    out["mean_k"] = sum(ks) / len(ks) if ks else 0.0                 # over all rounds
    out["mean_k_drafted"] = sum(drafted) / len(drafted) if drafted else 0.0   # over speculative rounds
    out["mean_k_fetched"] = sum(fetched) / len(fetched) if fetched else 0.0   # over rounds that called the drafter
    out["k0_share"] = (len(ks) - len(drafted)) / len(ks) if ks else 0.0
    print(json.dumps(out))


if __name__ == "__main__":
    main()
