"""Traces a Hugging Face causal LM (Llama family) into the decoder-with-past ONNX graph of ``tandem.export``.

The model itself is traced, wrapped so that the past tensors are turned into a ``DynamicCache``
inside the traced function and the updated cache is returned as plain tensors.
``torch.onnx.export(dynamo=True)`` (torch.export, the default exporter since torch 2.9) is tried
first; if it fails, the TorchScript exporter (``dynamo=False``) is tried (``export_graph``). Both
give the same graph interface (``io_names``); the parity check (``tandem.export_check``) is what
decides whether the result is usable.

torch and transformers are imported lazily so that ``tandem --help`` stays fast.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import sys
import warnings
from pathlib import Path

# Architectures whose HF implementation keeps a plain (non-sliding) DynamicCache of
# [batch, kv_heads, seq, head_dim] per layer. Only "llama" (SmolLM2) is tested; the parity check
# guards the others.
SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3")
EXPORTERS = ("auto", "dynamo", "torchscript")


def log(msg: str) -> None:
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


def io_names(num_layers: int) -> tuple[list[str], list[str]]:
    """(input names, output names) of the decoder-with-past graph of ``num_layers`` layers."""
    past = [f"past_key_values.{i}.{kv}" for i in range(num_layers) for kv in ("key", "value")]
    present = [f"present.{i}.{kv}" for i in range(num_layers) for kv in ("key", "value")]
    return ["input_ids", "attention_mask", "position_ids", *past], ["logits", *present]


def check_architecture(config) -> None:
    """Raises ValueError unless ``config`` is a full-attention decoder of ``SUPPORTED_MODEL_TYPES``."""
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


def decoder_dims(config) -> tuple[int, int, int]:
    """(layers, KV heads, head dim) of a decoder's config."""
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
    inputs, outputs = io_names(num_layers)
    ids, mask, pos, kv = example
    with torch.no_grad():
        program = torch.onnx.export(list_wrapper, (ids, mask, pos, kv), input_names=inputs,
                                    output_names=outputs, dynamic_shapes=dynamic_shapes, dynamo=True,
                                    opset_version=opset, external_data=external, optimize=True, verbose=False)
    program.save(str(path), external_data=external)


def _export_torchscript(wrapper, example, path: Path, num_layers, opset) -> None:
    import torch

    inputs, outputs = io_names(num_layers)
    axes = {"input_ids": {0: "batch", 1: "seq"}, "attention_mask": {0: "batch", 1: "past_plus_seq"},
            "position_ids": {0: "batch", 1: "seq"}, "logits": {0: "batch", 1: "seq"}}
    axes.update({n: {0: "batch", 2: "past"} for n in inputs[3:]})
    axes.update({n: {0: "batch", 2: "past_plus_seq"} for n in outputs[1:]})
    ids, mask, pos, kv = example
    with torch.no_grad():
        torch.onnx.export(wrapper, (ids, mask, pos, *kv), str(path), input_names=inputs, output_names=outputs,
                          dynamic_axes=axes, dynamo=False, opset_version=opset or 17, do_constant_folding=True)


def export_graph(model, path: Path, dims: tuple[int, int, int], vocab_size: int, *, opset: int | None,
                 external: bool, exporter: str, notes: list[str]) -> str:
    """Writes the decoder-with-past graph of ``model`` to ``path`` with ``exporter`` ('auto': dynamo, then
    TorchScript on failure, noted in ``notes``); returns the exporter used ('dynamo' or 'torchscript')."""
    num_layers, kv_heads, head_dim = dims
    wrapper, list_wrapper = _make_wrapper(model, num_layers)
    example = _example_inputs(num_layers, kv_heads, head_dim, vocab_size)
    if exporter in ("auto", "dynamo"):
        log("exporting with torch.onnx.export(dynamo=True) ...")
        try:
            with warnings.catch_warnings(), contextlib.redirect_stdout(sys.stderr), _quiet_torch_logs():
                warnings.simplefilter("ignore")
                _export_dynamo(list_wrapper, example, path, num_layers, opset, external)
            return "dynamo"
        except Exception as e:  # noqa: BLE001 - fall back to the TorchScript exporter
            if exporter == "dynamo":
                raise
            notes.append(f"dynamo export failed ({type(e).__name__}: {e}); used TorchScript")
            log(f"dynamo export failed ({type(e).__name__}: {str(e)[:300]}); trying dynamo=False")
    log("exporting with torch.onnx.export(dynamo=False) ...")
    with warnings.catch_warnings(), contextlib.redirect_stdout(sys.stderr):
        warnings.simplefilter("ignore")
        _export_torchscript(wrapper, example, path, num_layers, opset)
    return "torchscript"
