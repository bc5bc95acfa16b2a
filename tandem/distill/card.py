"""The model card (README.md) written beside a distilled drafter.

It is generated from ``distill_info.json`` (what ``tandem distill`` did) and, when present,
``eval.json`` (held-out acceptance and step cost, see ``tandem.distill.evaluate``).
"""

from __future__ import annotations

import json
import os
from pathlib import Path


def _fmt_s(s: float) -> str:
    s = float(s)
    return f"{s / 3600:.2f} h" if s >= 3600 else f"{s / 60:.1f} min" if s >= 60 else f"{s:.1f} s"


def _init_line(info: dict, st: dict) -> str:
    init = info.get("init") or {}
    if init.get("from_target_layers"):
        L, F = init["from_target_layers"], init.get("frozen_layers", 0)
        return (f"- Initialisation: the target's own first {L} decoder layers, its token embedding, final norm and "
                f"(tied) output head, copied. The embedding and the bottom {F} layers stay frozen (exactly the "
                f"target's); the top {L - F} layers, the final norm and the draft rows of the head are trained to "
                "predict the target's final next-token choice from those features (a truncated, fine-tuned target).")
    return ("- Initialisation: input embeddings and head = the target's embedding matrix projected on its top "
            f"{st.get('hidden')} principal directions (eigenvectors of E^T E); layers random (seeded).")


def write_card(out_dir: str | os.PathLike, info: dict, eval_info: dict | None = None, notes: str = "") -> Path:
    out = Path(out_dir)
    if eval_info is None and (out / "eval.json").exists():
        eval_info = json.loads((out / "eval.json").read_text())
    st = info.get("student", {})
    tr = info.get("train", {})
    hist = info.get("history", [])
    lines = [
        f"# Drafter for {info.get('target_name', info.get('target'))}",
        "",
        "A small causal LM that shares the target's tokenizer, trained by `tandem distill` to predict the "
        "target's next token (sequence-level distillation on the target's own answers, plus KL to the target's "
        "top-k log-probabilities from a teacher-forced pass). Used by the drafter service for speculative "
        "decoding; the target verifies every token, so outputs are exactly the target's.",
        "",
        "## Architecture",
        "",
        f"- LlamaForCausalLM: {st.get('layers')} layers, hidden {st.get('hidden')}, {st.get('heads')} heads "
        f"({st.get('kv_heads')} key/value heads), MLP {st.get('intermediate')}; the target's tokenizer "
        f"(vocabulary {info.get('vocab_size', 'of the target')}).",
        f"- Parameters: {info.get('parameters', 0) / 1e6:.2f} M (input embedding over the full target vocabulary, "
        f"output head over the draft vocabulary)"
        + (f"; {info['trained_parameters'] / 1e6:.2f} M of them trained." if "trained_parameters" in info else "."),
        f"- Draft vocabulary: {info.get('draft_vocab_size')} tokens (the most frequent target tokens in the "
        "training data, by token and by target top-1, plus all special tokens); `draft_vocab.npy` maps draft "
        "logit index -> target token id (int64). The drafter can only propose these tokens and reports q over "
        "them (q = 0 elsewhere), which keeps speculative sampling exact. In the Hugging Face weights the "
        "`lm_head` rows outside the draft vocabulary are untrained placeholders: use the draft rows only (the "
        "ONNX export has exactly those logits).",
        _init_line(info, st),
        "",
        "## Data (exactly)",
        "",
    ]
    for m in info.get("data", []):
        q = m.get("question_ids")
        qtxt = f", Spec-Bench question ids {q[0]}..{q[-1]} (all multiples of 4: the training split)" if q else ""
        src = m.get("from")
        stxt = (" (by source: " + ", ".join(f"{k} {v}" for k, v in src.items()) + ")") if isinstance(src, dict) else ""
        lines.append(f"- `{m.get('source')}` ({m.get('kind')}): {m.get('records')} records, "
                     f"{m.get('answer_tokens', m.get('tokens'))} answer tokens{qtxt}{stxt}.")
    lines += [
        f"- Split: {info.get('split')}. No held-out Spec-Bench question (question_id % 4 != 0) was used in "
        "training; the acceptance numbers below are on those.",
        "- Teacher pass: the target in fp32 over prompt + answer of every record (teacher forcing); kept "
        "per position: top-8 ids and log-probs. Trained positions: every answer position and a random 10 % of "
        "prompt positions.",
        "",
        "## Training",
        "",
        f"- {tr.get('step')} steps (a step = answers to one prompt, the prompt encoded once for them), "
        f"{tr.get('tokens_seen', 0) / 1e6:.2f} M tokens processed, {_fmt_s(tr.get('train_seconds', 0))} of "
        f"training compute; whole command {_fmt_s(info.get('wall_seconds', 0))} wall time "
        + (f"({info['device']})." if str(info.get("device", "cpu")).startswith("cuda") else
           f"(CPU, {info.get('train_config', {}).get('threads', 1)} torch thread(s))."),
        f"- Config: `{json.dumps(info.get('train_config', {}))}`",
        f"- Held-out greedy next-token agreement with the target (answer positions of held-out prompt groups of "
        f"the training data): {info.get('heldout_agreement', float('nan')):.3f}.",
    ]
    if hist:
        lines.append("- Progress (step: loss / held-out agreement): " + ", ".join(
            f"{h['step']}: {h['loss']:.2f}/{h['heldout_agree']:.3f}" for h in hist[:: max(1, len(hist) // 12)]))
    lines += ["", "## Reproduce", "", "```", info.get("command", ""), "```", ""]
    if eval_info:
        lines += ["## Evaluation (held-out Spec-Bench prompts)", ""]
        for name, ev in eval_info.get("tau", {}).items():
            lines.append(f"### {name}")
            lines.append("")
            lines.append(f"Greedy, k = {ev['k']}, {ev['prompts']} prompts, up to 128 new tokens, chat template: "
                         f"**tau = {ev['tau']:.3f}** tokens per target forward (acceptance rate "
                         f"{ev['acceptance_rate']:.3f}; per position {ev['per_position_acceptance']}).")
            lines.append("")
            lines.append("| category | tau | tokens | rounds |")
            lines.append("|---|---|---|---|")
            for c, v in ev["per_category"].items():
                lines.append(f"| {c} | {v['tau']:.3f} | {v['tokens']} | {v['rounds']} |")
            lines.append("")
        for name, c in eval_info.get("cost", {}).items():
            lines.append(f"- Step cost ({name}): drafter {c['drafter_ms']} ms (ONNX Runtime CPU, {c['ort_threads']} "
                         f"thread) vs target {c['target_ms']} ms (torch, {c['torch_threads']} thread(s)), 1 token with "
                         f"a KV cache of {c['context']} tokens: ratio **{c['ratio']:.3f}**.")
        if eval_info.get("commands"):
            lines += ["", "Commands:", "", "```"] + eval_info["commands"] + ["```"]
        lines.append("")
    if notes:
        lines += ["## Notes", "", notes, ""]
    path = out / "README.md"
    path.write_text("\n".join(lines))
    return path
