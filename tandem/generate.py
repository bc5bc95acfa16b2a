"""``tandem generate``: call a gateway and print the text, the statistics, or the whole reply as JSON."""

from __future__ import annotations

import argparse
import json
import sys

import grpc
from google.protobuf.json_format import MessageToDict

from tandem.pb import common_pb2, gateway_grpc, gateway_pb2
from tandem.pb_convert import round_from_pb
from tandem.flags import DEFAULT_HOST, DEFAULT_PORTS, address, draft_length, env, flag, security_flags
from tandem.round_record import round_table as record_table
from tandem.serving import CHANNEL_OPTIONS


def configure(p) -> None:
    p.add_argument("prompt", nargs="?", default=None, help="the prompt text; '-' reads it from stdin")
    flag(p, "prompt-file", None, help="read the prompt from this file (UTF-8) instead")
    flag(p, "gateway", f"{DEFAULT_HOST}:{DEFAULT_PORTS['gateway']}", help="gateway address host:port (without a "
         f"port: {DEFAULT_PORTS['gateway']})")
    flag(p, "max-tokens", 128, int, help="new tokens to generate at most")
    flag(p, "temperature", 0.0, float, help="0 = greedy; > 0 samples")
    flag(p, "top-k", 0, int, help="sample among the k most likely tokens (0 = off)")
    flag(p, "top-p", 1.0, float, help="nucleus sampling mass (1.0 = off)")
    flag(p, "seed", None, seed, help="sampling: an integer in [0, 2^64); the same seed gives the same text, token "
         "for token, whatever the draft length (-k), the drafter, prompt lookup, other requests or a drafter "
         "failing mid-request (each token is the target's own sample for the seed and its position), on a "
         "verifier whose verify rows are bit-identical to plain steps (the CPU fast path)")
    p.add_argument("-k", "--draft-length", type=draft_length, default=env("draft_length", "auto"),
                   help="draft length of this request's rounds: 'auto' (the gateway's default: chosen every round "
                        "from measured costs and acceptance) or a fixed k [env TANDEM_DRAFT_LENGTH]")
    flag(p, "draft-confidence", None, float, help="adaptive draft length for this request: the drafter stops "
         "before a token it is less sure of than this (0 = always -k tokens; default: the gateway's)")
    flag(p, "no-speculation", help="decode with the target alone (the baseline)", cast=bool)
    flag(p, "cache-salt", "", help="share the verifier's prefix cache only with requests of this salt (a prompt "
         "that begins like an earlier one of the same salt prefills only the rest; the text is the same either way)")
    flag(p, "chat", help="apply the target's chat template to the prompt", cast=bool)
    flag(p, "ignore-eos", help="keep generating past the EOS token", cast=bool)
    flag(p, "stream", help="print tokens as they are accepted", cast=bool)
    flag(p, "json", help="print the whole reply as one JSON object", cast=bool)
    flag(p, "trace", help="print the request's round-by-round timeline", cast=bool)
    flag(p, "timeout", 600.0, float, help="deadline of the call in seconds")
    security_flags(p, server=False)


def seed(value: str) -> int:
    """--seed's type: an integer in [0, 2^64)."""
    try:
        number = int(value)
    except ValueError:
        number = -1
    if not 0 <= number < 2**64:
        raise argparse.ArgumentTypeError(f"seed must be an integer in [0, 2**64), got {value!r}")
    return number


def run(args) -> int:
    args.prompt = read_prompt(args)
    return generate_command(args)


def read_prompt(args) -> str:
    """The prompt: the argument, stdin for '-', or --prompt-file (one of them; ValueError otherwise)."""
    prompt, path = getattr(args, "prompt", None), getattr(args, "prompt_file", None)
    if path and prompt is not None:
        raise ValueError("give the prompt either as an argument or with --prompt-file, not both")
    if path:
        from pathlib import Path

        file = Path(path).expanduser()
        if not file.is_file():
            raise FileNotFoundError(f"--prompt-file {path}: no such file")
        return file.read_text(encoding="utf-8")
    if prompt == "-":
        if sys.stdin is None or sys.stdin.isatty():
            raise ValueError("prompt '-' reads stdin, but stdin is a terminal: pipe the prompt in "
                             "(echo 'Hi' | tandem generate -) or use --prompt-file FILE")
        return sys.stdin.read()
    if prompt is None:
        raise ValueError("no prompt: give it as an argument (tandem generate \"Hi\"), '-' for stdin, or "
                         "--prompt-file FILE")
    return prompt


def build_request(args) -> gateway_pb2.GenerateRequest:
    sampling = common_pb2.SamplingParams(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p,
                                         seed=args.seed or 0, has_seed=args.seed is not None)
    return gateway_pb2.GenerateRequest(prompt=args.prompt, chat=args.chat, max_tokens=args.max_tokens,
                                       sampling=sampling, draft_length=args.draft_length,
                                       no_speculation=args.no_speculation, ignore_eos=args.ignore_eos,
                                       draft_confidence=getattr(args, "draft_confidence", None),
                                       cache_salt=getattr(args, "cache_salt", "") or "")


def decoding_mode(s: gateway_pb2.GenerateStats) -> str:
    """How the request was decoded, as the statistics show it: with the drafter, or the target alone (and why)."""
    if not s.speculative:
        mode = "target only"
    elif s.fallback_reason:
        mode = (f"speculative until the drafter failed (drafter {s.draft_model})" if s.proposed
                else "target only")
    elif not s.proposed:
        mode = f"target only (drafter {s.draft_model} on standby: no block paid for itself)"
    else:
        mode = f"speculative (drafter {s.draft_model})"
    return mode + (f" [fallback: {s.fallback_reason}]" if s.fallback_reason else "")


def stats_line(s: gateway_pb2.GenerateStats) -> str:
    drafted = (f"accepted {s.accepted}/{s.proposed} (rate {s.acceptance_rate:.2f}), " if s.proposed else "")
    return (f"{s.new_tokens} tokens in {s.total_ms / 1e3:.2f}s ({s.tokens_per_second:.1f} tok/s), TTFT "
            f"{s.ttft_ms:.0f} ms, {s.rounds} rounds, {drafted}mean acceptance length "
            f"{s.mean_acceptance_length:.2f} — {decoding_mode(s)}")


def round_table(s: gateway_pb2.GenerateStats) -> str:
    """The round-by-round timeline of a reply: where each round's time went."""
    return record_table([round_from_pb(r) for r in s.round_stats], s.prefill_ms)


def generate_command(args) -> int:
    from tandem import security

    from tandem.health import explain

    request = build_request(args)
    sec = security.default()
    metadata = sec.call_metadata()
    gateway = address(args.gateway, DEFAULT_PORTS["gateway"])
    with sec.sync_channel(gateway, options=CHANNEL_OPTIONS) as channel:
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
            reason = None
            if err.code() == grpc.StatusCode.UNAVAILABLE:     # the gateway itself, or one of its nodes?
                reason = explain("gateway", gateway, err.code(), err.details(), sec.client_tls, timeout=3.0)
            print(f"tandem generate: {reason or f'{err.code().name}: {err.details()}'}", file=sys.stderr)
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
