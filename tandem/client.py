"""``tandem generate``: call a gateway and print the text, the statistics, or the whole reply as JSON."""

from __future__ import annotations

import json
import sys

import grpc
from google.protobuf.json_format import MessageToDict

from tandem.pb import common_pb2, gateway_grpc, gateway_pb2
from tandem.serving import CHANNEL_OPTIONS


def build_request(args) -> gateway_pb2.GenerateRequest:
    sampling = common_pb2.SamplingParams(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p,
                                         seed=args.seed or 0, has_seed=args.seed is not None)
    return gateway_pb2.GenerateRequest(prompt=args.prompt, chat=args.chat, max_tokens=args.max_tokens,
                                       sampling=sampling, draft_length=args.draft_length,
                                       no_speculation=args.no_speculation, ignore_eos=args.ignore_eos,
                                       draft_confidence=getattr(args, "draft_confidence", None))


def stats_line(s: gateway_pb2.GenerateStats) -> str:
    mode = f"speculative (drafter {s.draft_model})" if s.speculative else "target only"
    if s.fallback_reason:
        mode += f" [fallback: {s.fallback_reason}]"
    return (f"{s.new_tokens} tokens in {s.total_ms / 1e3:.2f}s ({s.tokens_per_second:.1f} tok/s), TTFT "
            f"{s.ttft_ms:.0f} ms, {s.rounds} rounds, accepted {s.accepted}/{s.proposed} "
            f"(rate {s.acceptance_rate:.2f}), mean acceptance length {s.mean_acceptance_length:.2f} — {mode}")


def round_table(s: gateway_pb2.GenerateStats) -> str:
    """The round-by-round timeline: where each round's time went."""
    lines = [f"{'round':>5} {'k':>3} {'accepted':>8} {'reject@':>7} {'bonus':>5} {'draft ms':>9} "
             f"{'verify ms':>9} {'network ms':>10} {'round ms':>9}",
             f"{'0':>5} {'-':>3} {'prefill':>8} {'':>7} {'':>5} {'':>9} {s.prefill_ms:>9.1f} {'':>10} {'':>9}"]
    for r in s.round_stats:
        lines.append(f"{r.index:>5} {r.k:>3} {f'{r.accepted}/{r.proposed}':>8} "
                     f"{(str(r.rejection_position) if r.rejection_position >= 0 else '-'):>7} "
                     f"{('yes' if r.bonus else ''):>5} {r.draft_ms:>9.1f} {r.verify_ms:>9.1f} "
                     f"{r.overhead_ms:>10.1f} {r.round_ms:>9.1f}")
    lines.append(f"{'total':>5} {'':>3} {f'{s.accepted}/{s.proposed}':>8} {'':>7} {'':>5} {s.draft_ms:>9.1f} "
                 f"{s.verify_ms + s.prefill_ms:>9.1f} {s.overhead_ms:>10.1f} {s.total_ms:>9.1f}")
    return "\n".join(lines)


def generate_command(args) -> int:
    from tandem import security

    request = build_request(args)
    sec = security.default()
    metadata = sec.call_metadata()
    with sec.sync_channel(args.gateway, options=CHANNEL_OPTIONS) as channel:
        stub = gateway_grpc.GatewayStub(channel)
        try:
            if args.stream and not args.json:
                stats = None
                for chunk in stub.GenerateStream(request, timeout=args.timeout, metadata=metadata):
                    sys.stdout.write(chunk.text)
                    sys.stdout.flush()
                    if chunk.HasField("stats"):
                        stats = chunk.stats
                print()
                reply = gateway_pb2.GenerateReply(stats=stats)
            else:
                reply = stub.Generate(request, timeout=args.timeout, metadata=metadata)
        except grpc.RpcError as err:
            print(f"tandem generate: {err.code().name}: {err.details()}", file=sys.stderr)
            return 1
    if args.json:
        print(json.dumps(MessageToDict(reply, preserving_proto_field_name=True, always_print_fields_with_no_presence=True)))
        return 0
    if not args.stream:
        print(reply.text)
    print("\n" + stats_line(reply.stats), file=sys.stderr)
    if args.trace:
        print(round_table(reply.stats), file=sys.stderr)
    return 0
