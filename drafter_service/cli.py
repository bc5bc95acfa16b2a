"""``tandem serve-drafter`` (== ``python -m drafter_service``): the drafter's own flags and start-up.
Imports nothing of torch, transformers, the bench, distill or export tools (a .gguf drafter imports torch and
the verifier's decoder when it loads)."""

from __future__ import annotations

from tandem.flags import flag, server_flags


def configure(p) -> None:
    flag(p, "drafter", "default", help="drafter ONNX file or directory (model.onnx + drafter.json); "
         "'default' is the drafter shipped for the default target; 'suffix' is the model-free drafter (suffix "
         "drafting over the prompt, the output and the traffic it serves: any target, no model); a .gguf file: "
         "the target's own file, run with int8 activations (--drafter-activations), drafting far ahead on "
         "this box (needs torch here, as the verifier does)")
    flag(p, "threads", 1, int, help="threads a drafting forward uses (ONNX Runtime's intra-op threads; a .gguf "
         "drafter's decoder)")
    flag(p, "drafter-activations", "int8", choices=("int8", "fp32"), help="a .gguf drafter's arithmetic: int8 "
         "(llama.cpp's; about half the target's one-token step, its greedy token the target's at ~98 %% of "
         "positions) or fp32 (the target's own: every greedy token the target's, at the target's cost)")
    flag(p, "drafter-guesses", 1, int, help="a .gguf drafter feeds, beside each token it drafts, this many tokens "
         "guessed to follow it (what followed the last tokens' latest earlier occurrence, else its habit: "
         "--drafter-guess-seed): where its next token is "
         "the guess, that step is skipped. Same tokens, ~10-18 %% less time a drafted token on one Zen 4 core "
         "(a row beside another costs ~7 %% of a step); 0 = off")
    flag(p, "drafter-long-guesses", 7, int, help="where the session's text loops (its last 8 tokens recur), a .gguf "
         "drafter with guesses on guesses this many tokens in a chain instead: one wider forward drafts up to that "
         "many more (same tokens; ~20 %% less time a drafted token over long answers that repeat themselves); "
         "0 = as --drafter-guesses")
    flag(p, "drafter-guess-seed", "auto", help="text a .gguf drafter's guesses start from where the session's text "
         "has none (its habits: the token it most often drafted after each one, learned from every session it "
         "serves): JSON lines of token ids (drafter_service/suffix_store.py), comma-separated files; 'auto' = the "
         "shipped drafter's answers to its training questions when its vocabulary is this model's; 'none'")
    flag(p, "support-size", 64, int, help="sampled drafts: q is truncated to its top-N tokens (exactly what is "
         "sampled from and sent to the verifier)")
    flag(p, "lookup-ngram", -1, int, help="prompt lookup: when the context's last n-gram (n = this .. "
         "--lookup-min-ngram) recurred earlier, draft the tokens that followed it for free (q = point mass, "
         "exact); the model drafts the rest. 0 turns it off; -1: 4 for an ONNX model, 0 for a .gguf drafter "
         "(whose own tokens are kept far more often than copies)")
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
    flag(p, "suffix-seed", "auto", help="text global suffix drafting starts from (JSON lines of token ids, gzip or "
         "plain; drafter_service/suffix_store.py): comma-separated files; 'auto' = the drafter directory's "
         "suffix_seed.jsonl.gz (the shipped drafter's: its target's answers to training questions); 'none'")
    flag(p, "suffix-store", None, help="keep what global suffix drafting learned across restarts: read this file at "
         "start (when it exists, instead of the seeds: it holds what was kept of them), write it at stop and every "
         "--suffix-save-interval seconds (owner-only, 0600: it holds the sessions' text)")
    flag(p, "suffix-save-interval", 300.0, float, help="seconds between writes of --suffix-store (0: at stop only)")
    flag(p, "prefill-chunk", 512, int, help="most context tokens the drafter feeds in one ONNX run (a 4 000-token "
         "prompt: ~1 s in chunks vs 4-7 s and 3.3 GB in one run); 0 = one run")
    flag(p, "session-ttl", 600.0, float, help="seconds after which an idle session's KV cache is freed")
    flag(p, "max-sessions", 256, int, help="most sessions held at once")
    server_flags(p, 50061)


def load(args):
    """The drafter the flags describe."""
    from drafter_service.factory import load_drafter
    from tandem.defaults import resolve_drafter

    path = resolve_drafter(args.drafter)
    options = ({"activations": args.drafter_activations, "guesses": args.drafter_guesses,
                "long_guesses": args.drafter_long_guesses,
                "guess_seed": args.drafter_guess_seed} if is_gguf(path) else {})
    return load_drafter(path, threads=args.threads, support_size=args.support_size,
                        session_ttl_s=args.session_ttl, max_sessions=args.max_sessions,
                        prefill_chunk=args.prefill_chunk, lookup_max_ngram=lookup_ngram(args.lookup_ngram, path),
                        lookup_min_ngram=args.lookup_min_ngram, lookup_trust_ngram=args.lookup_trust_ngram,
                        lookup_check_confidence=args.lookup_check_confidence, suffix=args.suffix == "on",
                        suffix_scope=args.suffix_scope, suffix_memory_tokens=args.suffix_memory_tokens,
                        suffix_seed=args.suffix_seed, suffix_store=args.suffix_store, **options)


async def run(args) -> int:
    from tandem import phases as loading
    from drafter_service.server import start_drafter
    from tandem import telemetry
    from tandem.serving import serve_until_stopped

    loading.enter("loading the drafter")
    drafter = load(args)
    store = SuffixStoreKeeper.of(drafter, args.suffix_store, args.suffix_save_interval)
    loading.enter("warming")
    warm(drafter)                                       # before tracing: the warm-up is nobody's trace
    tracing = telemetry.setup("tandem-drafter")
    service = await start_drafter(drafter, args.host, args.port, interceptors=tracing.server_interceptors())
    if store is not None:
        store.start()
    return await serve_until_stopped(service, f"drafter ({drafter.info.model_name})", args, tracing,
                                     on_stop=store.stop if store is not None else None)


class SuffixStoreKeeper:
    """Writes the global suffix index to ``--suffix-store`` every ``interval`` seconds and at stop (off the
    event loop: a million tokens take a few seconds to write)."""

    def __init__(self, index, path: str, interval: float):
        self.index, self.path, self.interval = index, path, interval
        self._task = None

    @classmethod
    def of(cls, drafter, path: str | None, interval: float):
        from drafter_service.suffix_drafter import SuffixDrafter

        if isinstance(drafter, SuffixDrafter) and drafter.index is not None:
            print(f"[drafter] suffix index: {drafter.index.tokens} tokens read in "
                  f"({drafter.index.sequences()} sequences)", flush=True)
            return cls(drafter.index, path, interval) if path else None
        if path:
            raise ValueError("--suffix-store keeps the global suffix index: turn suffix drafting on (--suffix on, "
                             "or --drafter suffix) with --suffix-scope global")
        return None

    def start(self) -> None:
        import asyncio

        if self.interval > 0:
            self._task = asyncio.get_running_loop().create_task(self._every())

    async def _every(self) -> None:
        import asyncio

        while True:
            await asyncio.sleep(self.interval)
            await self.save()

    async def save(self) -> None:
        import asyncio

        from drafter_service import suffix_store

        try:
            tokens = await asyncio.get_running_loop().run_in_executor(None, suffix_store.save, self.index, self.path)
            print(f"[drafter] suffix index: {tokens} tokens written to {self.path}", flush=True)
        except OSError as exc:                  # a full disk costs what was learned since the last write, not the node
            print(f"[drafter] suffix index: cannot write {self.path}: {exc}", flush=True)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
        await self.save()


def is_gguf(path) -> bool:
    from drafter_service.factory import MODEL_FREE_KINDS, drafter_kind

    return str(path) not in MODEL_FREE_KINDS and drafter_kind(path) == "gguf"


def lookup_ngram(flag_value: int, path) -> int:
    """--lookup-ngram, with -1 resolved by the drafter's kind: 0 for a .gguf drafter (its tokens are kept about
    nine times in ten, a copy's about half as often: BENCHMARKS.md, twenty-ninth session), else 4."""
    if flag_value >= 0:
        return flag_value
    return 0 if is_gguf(path) else 4


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
