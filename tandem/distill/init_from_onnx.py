"""A training checkpoint from a shipped drafter graph, so ``tandem distill --init-from`` can continue it.

A shipped drafter keeps only its ONNX graph (int8 weights); the training run's fp32 checkpoint stays in
the machine's ``.distill_work``. This reads a classic decoder-with-past graph (``tandem.export_read``; a
shared-KV graph was converted from one, named in its ``drafter.json`` ``converted_from``: take that file
from git), dequantizes its weights ((w - zero point) x scale) into the student ``tandem distill`` builds
(LlamaForCausalLM, the target's rope and vocabulary) and writes ``{"model": state_dict, "head": draft rows}``
with the graph's ``draft_vocab.npy`` beside it, which is what ``--init-from`` reads.

``python -m tandem.distill.init_from_onnx --graph DIR --out WORK/init.pt``
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import numpy as np


def _dequant(w: np.ndarray, scale, zero_point) -> np.ndarray:
    if scale is None:
        return w.astype(np.float32)
    zp = np.zeros((), np.float32) if zero_point is None else zero_point.astype(np.float32)
    return (w.astype(np.float32) - zp) * scale.astype(np.float32)


def checkpoint_from_graph(graph_dir: str | os.PathLike, target: str = "default") -> tuple[dict, np.ndarray]:
    """({"model", "head"}, draft vocabulary) of the classic graph in ``graph_dir``."""
    import torch

    from tandem.export_read import read_classic
    from tandem.models import load_causal_lm

    from . import student

    graph_dir = Path(graph_dir)
    w = read_classic(graph_dir / "model.onnx")
    dv_file = graph_dir / "draft_vocab.npy"
    draft_vocab = (np.load(dv_file).astype(np.int64) if dv_file.exists()
                   else np.arange(w.head.weight.shape[1], dtype=np.int64))      # a head over the whole vocabulary
    hidden = w.layers[0].q.weight.shape[0]
    spec = student.StudentSpec(hidden=hidden, layers=len(w.layers), heads=w.num_heads, kv_heads=w.num_kv_heads,
                               intermediate=w.layers[0].gate.weight.shape[1], draft_vocab=len(draft_vocab))
    target_model, tokenizer, _ = load_causal_lm(target)
    model = student.build_student(target_model, tokenizer, spec, draft_vocab)
    sd = model.state_dict()

    def put(name: str, value: np.ndarray) -> None:
        t = torch.from_numpy(np.array(value, dtype=np.float32))
        if sd[name].shape != t.shape:
            raise ValueError(f"{name}: the graph has {tuple(t.shape)}, the student {tuple(sd[name].shape)}")
        sd[name] = t

    put("model.embed_tokens.weight", _dequant(w.embedding, w.embedding_scale, w.embedding_zero_point))
    for i, layer in enumerate(w.layers):
        p = f"model.layers.{i}."
        put(p + "input_layernorm.weight", layer.input_norm)
        put(p + "post_attention_layernorm.weight", layer.post_norm)
        for name, lin in (("self_attn.q_proj", layer.q), ("self_attn.k_proj", layer.k), ("self_attn.v_proj", layer.v),
                          ("self_attn.o_proj", layer.o), ("mlp.gate_proj", layer.gate), ("mlp.up_proj", layer.up),
                          ("mlp.down_proj", layer.down)):
            put(p + name + ".weight", _dequant(lin.weight, lin.scale, lin.zero_point).T)   # [in, out] -> [out, in]
    put("model.norm.weight", w.final_norm)
    head = torch.from_numpy(_dequant(w.head.weight, w.head.scale, w.head.zero_point).T.copy())   # [draft, hidden]
    full = torch.zeros_like(sd["lm_head.weight"])
    full[torch.from_numpy(draft_vocab)] = head
    sd["lm_head.weight"] = full
    model.load_state_dict(sd)
    return {"model": model.state_dict(), "head": head, "from": str(graph_dir)}, draft_vocab


def main(argv=None) -> int:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    p = argparse.ArgumentParser(prog="python -m tandem.distill.init_from_onnx", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--graph", required=True, help="a directory with a classic model.onnx and its draft_vocab.npy")
    p.add_argument("--out", required=True, help="the checkpoint to write (draft_vocab.npy goes beside it)")
    p.add_argument("--target", default="default", help="the target the drafter serves (default: default)")
    args = p.parse_args(argv)
    import torch

    ckpt, draft_vocab = checkpoint_from_graph(args.graph, args.target)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    torch.save(ckpt, out)
    np.save(out.parent / "draft_vocab.npy", draft_vocab)
    print(f"[init_from_onnx] {out}: {sum(v.numel() for v in ckpt['model'].values()) / 1e6:.1f} M values, "
          f"draft vocabulary {len(draft_vocab)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
