"""``tandem bench``: speculative decoding against plain decoding on Spec-Bench, measured end to end.

How a run goes (``tandem.bench.runner``):

1. Services: either live ones (``--gateway``) or the three started as processes, as ``tandem up``
   does (``tandem.up.start_cluster``), with the same target for every mode. A gateway the bench
   starts gets ``--draft-length auto`` (a request's draft_length 0 means the gateway's default, so
   only then is the ``auto`` mode the automatic choice; the fixed-k modes pin their own k).
2. Workload (``tandem.bench.workload``): Spec-Bench questions, first turn, the target's chat template
   applied; by default the benchmark split (``question_id % 4 != 0``; the other quarter trains the
   distilled drafter).
3. Modes (``tandem.bench.modes``): baseline (plain decoding through the verifier), ``auto`` (the
   gateway's automatic draft length, the default speculative mode), the fixed-k sweep, adaptive
   (all through ``tandem.bench.gateway_runner``), the HF transformers pair (``tandem.bench.hf_peer``)
   and the llama.cpp pair (``tandem.bench.llama_peer``, optional extra ``tandem-spec[llama]``;
   skipped with one line when ``llama_cpp`` is absent).
   Warm-up (``tandem.bench.plan``): a short priming request, then one untimed request per mode; the
   warm-up times give the plan's projection, and modes that would not fit ``--time-budget`` are
   skipped (said loudly).
4. Timed phase: for each repeat, for each prompt, every mode in turn (interleaved, so drift in the
   machine's load hits all modes alike).
5. Analysis (``tandem.bench.analysis``: auto vs the best fixed k and plain, auto's rounds per k,
   llama.cpp's agreement with the target's greedy output; the memory-bandwidth floor from
   ``tandem.bench.environment``), JSON + Markdown report (``tandem.bench.report``), PNG plots
   (``tandem.bench.plots``).

Definitions (Spec-Bench, vLLM; see docs/DESIGN.md): tokens/s of a request = new tokens /
client-side wall time of the request (prefill included); speedup of a mode = mean over prompts of
its tokens/s / the same mean for the baseline (plain decoding through the same verifier); mean
acceptance length = tokens emitted per target forward after the prefill.
"""
