"""``tandem serve-drafter`` (== ``python -m drafter_service``): the drafter's own flags and start-up.
Imports nothing of torch, transformers, the bench, distill or export tools."""

from __future__ import annotations

from tandem.flags import flag, server_flags


def configure(p) -> None:
    flag(p, "drafter", "default", help="drafter ONNX file or directory (model.onnx + drafter.json); "
         "'default' is the drafter shipped for the default target; 'suffix' is the model-free drafter (suffix "
         "drafting over the prompt, the output and the traffic it serves: any target, no model)")
    flag(p, "threads", 1, int, help="ONNX Runtime intra-op threads")
    flag(p, "support-size", 64, int, help="sampled drafts: q is truncated to its top-N tokens (exactly what is "
         "sampled from and sent to the verifier)")
    flag(p, "lookup-ngram", 4, int, help="prompt lookup: when the context's last n-gram (n = this .. "
         "--lookup-min-ngram) recurred earlier, draft the tokens that followed it for free (q = point mass, "
         "exact); the model drafts the rest. 0 turns it off")
    flag(p, "lookup-min-ngram", 1, int, help="shortest n-gram prompt lookup matches")
    flag(p, "lookup-trust-ngram", 1, int, help="lookup tokens found by a shorter n-gram are checked against the "
         "model: kept while its top token agrees or it is unsure (below --lookup-check-confidence); 1 = never check "
         "(2 raises acceptance ~1.5 %% but costs a drafter run a round: not faster on the 2-core CPU, BENCHMARKS.md)")
    flag(p, "lookup-check-confidence", 0.5, float, help="the model's top probability from which its disagreement "
         "drops a checked lookup token")
    flag(p, "suffix", "off", choices=("on", "off"), help="suffix drafting in front of the model: the most frequent "
         "continuation of the context's longest recurring suffix, in this session's text and (--suffix-scope "
         "global) the traffic served before, copied for free (q = point mass, exact); the model drafts the rest. "
         "Always on with --drafter suffix")
    flag(p, "suffix-scope", "global", choices=("global", "session", "off"), help="what suffix drafting learns "
         "from: global = every session's text, kept after it ends (the home's traffic; another session's text "
         "can only be proposed, never emitted: verification is exact, only speed tells); session = each session's "
         "own prompt and output; off = no suffix drafting")
    flag(p, "suffix-memory-tokens", 1_000_000, int, help="global suffix drafting keeps at most this many tokens of "
         "finished sessions' text (about 350 bytes each), the least recently used evicted first")
    flag(p, "prefill-chunk", 512, int, help="most context tokens the drafter feeds in one ONNX run (a 4 000-token "
         "prompt: ~1 s in chunks vs 4-7 s and 3.3 GB in one run); 0 = one run")
    flag(p, "session-ttl", 600.0, float, help="seconds after which an idle session's KV cache is freed")
    flag(p, "max-sessions", 256, int, help="most sessions held at once")
    server_flags(p, 50061)


async def run(args) -> int:
    from drafter_service.factory import load_drafter
    from tandem import phases as loading
    from drafter_service.server import start_drafter
    from tandem import telemetry
    from tandem.defaults import resolve_drafter
    from tandem.serving import serve_until_stopped

    loading.enter("loading the drafter")
    drafter = load_drafter(resolve_drafter(args.drafter), threads=args.threads, support_size=args.support_size,
                           session_ttl_s=args.session_ttl, max_sessions=args.max_sessions,
                           prefill_chunk=args.prefill_chunk, lookup_max_ngram=args.lookup_ngram,
                           lookup_min_ngram=args.lookup_min_ngram, lookup_trust_ngram=args.lookup_trust_ngram,
                           lookup_check_confidence=args.lookup_check_confidence, suffix=args.suffix == "on",
                           suffix_scope=args.suffix_scope, suffix_memory_tokens=args.suffix_memory_tokens)
    loading.enter("warming")
    warm(drafter)                                       # before tracing: the warm-up is nobody's trace
    tracing = telemetry.setup("tandem-drafter")
    service = await start_drafter(drafter, args.host, args.port, interceptors=tracing.server_interceptors())
    return await serve_until_stopped(service, f"drafter ({drafter.info.model_name})", args, tracing)


def warm(drafter, prompt_tokens: int = 64, rounds: int = 3) -> None:
    """A few proposals in a scratch session before the service reports SERVING, so the first request does not
    pay ONNX Runtime's first-run allocations. Suffix drafting is left out: it has nothing to warm, and the
    scratch session's text must not be learned as traffic."""
    from drafter_service.suffix_drafter import SuffixDrafter
    from tandem.types import SamplingParams

    if isinstance(drafter, SuffixDrafter):
        drafter = drafter.inner
    if drafter is None:
        return
    vocab = max(2, drafter.info.vocab_size)
    context = [i % vocab for i in range(1, prompt_tokens + 1)]
    for sampling in (SamplingParams(), SamplingParams(temperature=1.0, seed=0)):
        for r in range(rounds):
            drafter.propose("tandem-warmup", 0 if r == 0 else len(context), [] if r else context, 4, sampling)
        drafter.end_session("tandem-warmup")
