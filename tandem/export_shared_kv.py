"""Rewrites a drafter's decoder-with-past ONNX graph into one whose KV cache is a buffer shared by past and present.

The graph ``tandem.export`` writes returns ``present = concat(past, new)`` on every run, so each drafted
token copies the whole KV cache (and, in the exported attention, expands the KV heads to the query heads,
transposes the keys and builds a causal mask over the whole context): on a 2-core CPU that is most of a
drafted token's cost past a few hundred tokens of context. The graph written here attends with ONNX
Runtime's ``GroupQueryAttention`` (com.microsoft; rotary embedding inside) over KV buffers of a fixed
capacity that the caller binds as both ``past`` and ``present`` (I/O binding): a run writes the new rows in
place and reads the rest where they are. Rolling back is free (the next run passes a shorter length), and
the output head runs on the last ``logits_to_keep`` positions only, so feeding n tokens of catch-up costs
one head, not n::

    inputs   input_ids                 int64   [1, seq]
             past_key_values.{i}.key   float32 [1, kv_heads, capacity, head_dim]   (i = 0 .. layers-1)
             past_key_values.{i}.value float32 [1, kv_heads, capacity, head_dim]
             seqlens_k                 int32   [1]   past + seq - 1
             total_sequence_length     int32   []    past + seq
             logits_to_keep            int64   [1]   how many of the last positions get logits (1 .. seq)
    outputs  logits                    float32 [1, logits_to_keep, vocab]
             present.{i}.key           float32 [1, kv_heads, capacity, head_dim]   (the past buffer, rows
             present.{i}.value         float32 [1, kv_heads, capacity, head_dim]    [past, past+seq) written)

``capacity`` is the caller's choice (at least past + seq, at most ``max_positions``, the rows of the rotary
tables; the ONNX metadata ``max_positions`` says how many). ``drafter.json`` says ``"kv_cache": "shared"``.

The weights are read back from the classic graph (either exporter, fp32 or int8) and kept as they are
(``tandem.export_read``); ``tandem.export_shared_graph`` builds the graph around them and says how it
keeps the classic graph's arithmetic and where it differs. With prompts to check on, ``convert`` runs
``tandem.export_check.parity``: the two graphs fed the same tokens.

    python -m tandem.export_shared_kv --from OLD_DIR --out NEW_DIR [--check-prompts 24]

The conversion needs onnx, onnxruntime and numpy; the check's held-out prompts need the tokenizer
(transformers).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from tandem.export import METADATA_FILE, MODEL_FILE
from tandem.export_check import PARITY_TOLERANCE, parity
from tandem.export_read import read_classic
from tandem.export_shared_graph import SHARED_KV, build_shared_kv


@dataclass
class ConversionReport:
    """What ``convert`` wrote: the graph's size before and after, and the parity figures when checked."""

    source: str
    onnx_path: str
    quantized: bool
    num_layers: int
    max_positions: int
    nodes_before: int
    nodes_after: int
    parity: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return asdict(self)


def _source_paths(source) -> tuple[Path, Path]:
    src = Path(source).expanduser()
    onnx_path = src / MODEL_FILE if src.is_dir() else src
    if not onnx_path.exists():
        raise FileNotFoundError(f"{onnx_path} not found")
    return onnx_path, onnx_path.parent / METADATA_FILE


def _sha256(path: Path) -> str:
    import hashlib

    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return "sha256:" + h.hexdigest()


def heldout_prompts(drafter_dir, count: int, max_tokens: int = 512) -> list[list[int]]:
    """The first ``count`` held-out Spec-Bench prompts (``tandem.bench.workload``, split "bench", interleaved by
    category) in the drafter's chat template, as token ids (at most ``max_tokens``)."""
    from transformers import AutoTokenizer

    from tandem.bench.workload import interleave_by_category, load_questions

    tok = AutoTokenizer.from_pretrained(str(drafter_dir))
    out = []
    for p in interleave_by_category(load_questions(split="bench"))[:count]:
        ids = tok.apply_chat_template([{"role": "user", "content": p.text}], add_generation_prompt=True,
                                      tokenize=True)
        ids = ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids
        out.append([int(i) for i in ids][:max_tokens])
    return out


def convert(source, out_dir, *, max_positions: int | None = None, check_prompts: list[list[int]] | None = None,
            steps: int = 32) -> ConversionReport:
    """Writes ``out_dir/model.onnx`` (the shared-buffer graph of the classic drafter ``source``, a directory or
    .onnx file) and ``drafter.json`` (the source's, plus ``kv_cache`` and ``converted_from``); copies the other
    files of a source directory. ``max_positions``: the rows of the rotary tables (default: drafter.json's
    max_context). With ``check_prompts`` (token ids) the parity check runs; fp32 graphs must agree within
    1e-3, int8 graphs are reported only."""
    import onnx

    onnx_path, meta_path = _source_paths(source)
    meta = json.loads(meta_path.read_text()) if meta_path.exists() else {}
    if meta.get("kv_cache") == SHARED_KV:
        raise ValueError(f"{onnx_path} is already a shared-buffer graph")
    max_positions = int(max_positions or meta.get("max_context") or 0)
    if max_positions <= 0:
        raise ValueError("the rotary tables need a length: give max_positions (no max_context in drafter.json)")
    weights = read_classic(onnx_path)
    if weights.head_dim % 16:
        raise ValueError(f"{onnx_path}: ONNX Runtime's GroupQueryAttention needs a head_dim that is a multiple of 16 "
                         f"(this model's is {weights.head_dim}); keep the classic graph")
    model = build_shared_kv(weights, max_positions)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    nodes_before = len(onnx.load(str(onnx_path), load_external_data=False).graph.node)
    source_sha = _sha256(onnx_path)
    with tempfile.TemporaryDirectory(dir=out, prefix=".shared-kv-") as tmp:
        written = Path(tmp) / MODEL_FILE
        onnx.save(model, str(written))
        report = ConversionReport(source=str(onnx_path), onnx_path=str(out / MODEL_FILE),
                                  quantized=weights.head.quantized, num_layers=len(weights.layers),
                                  max_positions=max_positions, nodes_before=nodes_before,
                                  nodes_after=len(model.graph.node))
        if check_prompts:
            dv = meta.get("draft_vocab")
            draft_vocab = np.load(onnx_path.parent / dv) if dv else None
            report.parity = parity(onnx_path, written, check_prompts, steps, draft_vocab)
            worst = max(report.parity[p]["max_abs_logit_diff"] for p in ("prompt", "greedy_steps"))
            if not report.quantized and worst > PARITY_TOLERANCE:
                raise RuntimeError(f"the shared-buffer graph does not match {onnx_path}: max logits diff {worst:.3g} "
                                   f"> {PARITY_TOLERANCE}")
        if onnx_path.parent.resolve() != out.resolve():
            for f in onnx_path.parent.iterdir():
                if f.is_file() and f.name not in (MODEL_FILE, METADATA_FILE) and not f.name.startswith(MODEL_FILE):
                    shutil.copy2(f, out / f.name)
        shutil.move(str(written), out / MODEL_FILE)
    meta = {**meta, "kv_cache": SHARED_KV,
            "converted_from": {"file": onnx_path.name, "sha256": source_sha, "by": "python -m tandem.export_shared_kv"}}
    if not meta.get("max_context"):
        meta["max_context"] = max_positions
    (out / METADATA_FILE).write_text(json.dumps(meta, indent=2) + "\n")
    return report


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tandem.export_shared_kv", description=__doc__.split("\n")[0])
    p.add_argument("--from", dest="source", required=True, metavar="DIR",
                   help="a classic drafter (directory with model.onnx and drafter.json, or the .onnx file)")
    p.add_argument("--out", required=True, metavar="DIR", help="where to write model.onnx and drafter.json "
                   "(the other files of the source directory are copied); may be the source directory")
    p.add_argument("--max-positions", type=int, default=None,
                   help="rows of the rotary tables, the longest context (default: drafter.json max_context)")
    p.add_argument("--check-prompts", type=int, default=24, metavar="N",
                   help="parity check on the first N held-out Spec-Bench prompts in the drafter's chat template "
                        "(needs the tokenizer files and transformers; 0: no check). Default: %(default)s")
    p.add_argument("--steps", type=int, default=32, help="greedy tokens per prompt in the check (default 32)")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    args = p.parse_args(argv)
    onnx_path, _ = _source_paths(args.source)
    prompts = heldout_prompts(onnx_path.parent, args.check_prompts) if args.check_prompts else None
    try:
        report = convert(args.source, args.out, max_positions=args.max_positions, check_prompts=prompts,
                         steps=args.steps)
    except (FileNotFoundError, ValueError, RuntimeError) as e:
        print(f"tandem.export_shared_kv: error: {e}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(report.to_dict(), indent=2))
    else:
        print(f"{report.onnx_path}: {report.nodes_before} -> {report.nodes_after} nodes, "
              f"rotary tables for {report.max_positions} positions")
        for phase, d in report.parity.items():
            if isinstance(d, dict):
                print(f"  {phase:16s} positions {d['positions']:6d}  top-1 agreement {d['top1_agreement']:.4f}  "
                      f"rows identical {d['identical_rows']}  max |logit diff| {d['max_abs_logit_diff']:.3g}  "
                      f"max |q diff| {d['max_abs_q_diff']:.3g}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
