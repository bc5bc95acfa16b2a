"""``tandem bench``: speculative decoding against plain decoding on Spec-Bench, measured end to end.

How a run goes (``tandem.bench.runner``):

1. Services: either live ones (``--gateway``) or the three started as processes, as ``tandem up``
   does (``tandem.up.start_cluster``), with the same target for every mode.
2. Workload (``tandem.bench.workload``): Spec-Bench questions, first turn, the target's chat template
   applied; by default the benchmark split (``question_id % 4 != 0``; the other quarter trains the
   distilled drafter).
3. Warm-up: a short priming request, then one untimed request per mode; the warm-up times give the
   plan's projection, and modes that would not fit ``--time-budget`` are skipped (said loudly).
4. Timed phase: for each repeat, for each prompt, every mode in turn (interleaved, so drift in the
   machine's load hits all modes alike).
5. Analysis (``tandem.bench.analysis``), JSON + Markdown report (``tandem.bench.report``), PNG plots
   (``tandem.bench.plots``).

Definitions (Spec-Bench, vLLM; see ``/work/shared/DESIGN.md``): tokens/s of a request = new tokens /
client-side wall time of the request (prefill included); speedup of a mode = mean over prompts of
its tokens/s / the same mean for the baseline (plain decoding through the same verifier); mean
acceptance length = tokens emitted per target forward after the prefill.
"""
