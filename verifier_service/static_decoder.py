"""The decoder (``verifier_service.decoder``) over a transformers model's own fp32 weights: the fast path for
a Hugging Face model directory (a GGUF target reads its file instead: ``gguf_model``).

``StaticDecoder(model)`` builds a ``Decoder`` from a Llama-family model (Llama, Mistral without a sliding
window, Qwen2, Qwen3): its ``DecoderSpec`` from the config, q/k/v and gate/up merged into one weight each
(the model's own linears become views of the merged weights: no second dense copy, and the transformers
model keeps working), the rope tables from the model's own rotary embedding (so every rope type it
implements with a static table is right). transformers' weights keep the halves rope layout.
``unsupported_reason(model)`` says why another model keeps transformers' forward (``Target`` falls back).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import torch
from torch import nn

from verifier_service import ops as backends
from verifier_service.architecture import HALVES, DecoderSpec
from verifier_service.decoder import Decoder, DecoderWeights, LayerWeights, RopeTables
from verifier_service.weights import DenseWeight

SUPPORTED_TYPES = ("llama", "mistral", "qwen2", "qwen3")


def unsupported_reason(model) -> str | None:
    """None when ``StaticDecoder`` can run ``model``; otherwise why not (kept for the start-up line)."""
    config = getattr(model, "config", None)
    if config is None or getattr(config, "model_type", None) not in SUPPORTED_TYPES:
        return f"model type {getattr(config, 'model_type', None)!r} is not one of {SUPPORTED_TYPES}"
    if getattr(config, "sliding_window", None) and getattr(config, "use_sliding_window", True):
        return "sliding-window attention"
    rope = getattr(config, "rope_scaling", None) or getattr(config, "rope_parameters", None) or {}
    rope_type = rope.get("rope_type", rope.get("type", "default")) if isinstance(rope, dict) else "default"
    if rope_type in ("dynamic", "longrope"):
        return f"rope type {rope_type!r} (its frequencies depend on the sequence length; the table here is static)"
    if getattr(config, "hidden_act", "silu") != "silu":
        return f"activation {config.hidden_act!r}"
    inner = getattr(model, "model", None)
    layers = getattr(inner, "layers", None)
    if layers is None or not hasattr(inner, "rotary_emb") or not hasattr(inner, "norm"):
        return "not a decoder with model.layers / rotary_emb / norm"
    weight = model.get_output_embeddings().weight
    if weight.device.type != "cpu" or weight.dtype != torch.float32:
        return f"the static decoder is for CPU fp32 ({weight.device.type}, {weight.dtype})"
    qk_norms = config.model_type == "qwen3"
    for layer in layers:
        a, m = layer.self_attn, layer.mlp
        if not all(hasattr(a, n) for n in ("q_proj", "k_proj", "v_proj", "o_proj")):
            return "attention without q/k/v/o projections"
        if not all(hasattr(m, n) for n in ("gate_proj", "up_proj", "down_proj")):
            return "MLP without gate/up/down projections"
        if (getattr(a, "q_norm", None) is not None) != qk_norms:
            return "q/k norms"
        if m.gate_proj.bias is not None or m.up_proj.bias is not None or m.down_proj.bias is not None:
            return "MLP biases"
        if len({a.q_proj.bias is None, a.k_proj.bias is None, a.v_proj.bias is None}) != 1:
            return "mixed q/k/v biases"
    return None


def supports(model) -> bool:
    return unsupported_reason(model) is None


def _merged(linears: Sequence[nn.Linear]) -> DenseWeight:
    """One weight whose rows are ``linears``' rows; the originals' weights become views into it."""
    weight = torch.cat([lin.weight.detach() for lin in linears]).contiguous()
    bias = None if linears[0].bias is None else torch.cat([lin.bias.detach() for lin in linears]).contiguous()
    merged = DenseWeight(weight, bias=bias)
    row = 0
    for lin in linears:
        rows = lin.weight.shape[0]
        lin.weight = nn.Parameter(merged.linear.weight[row:row + rows], requires_grad=False)
        if bias is not None:
            lin.bias = nn.Parameter(merged.linear.bias[row:row + rows], requires_grad=False)
        row += rows
    return merged


def spec_of(model) -> DecoderSpec:
    config = model.config
    heads = int(config.num_attention_heads)
    head_dim = int(getattr(config, "head_dim", None) or config.hidden_size // heads)
    layers = int(config.num_hidden_layers)
    attn = model.model.layers[0].self_attn
    return DecoderSpec(architecture=config.model_type, layers=layers, hidden=int(config.hidden_size), heads=heads,
                       kv_heads=int(getattr(config, "num_key_value_heads", None) or heads), head_dim=head_dim,
                       ffn=int(config.intermediate_size), vocab=int(model.get_output_embeddings().weight.shape[0]),
                       context=int(getattr(config, "max_position_embeddings", 2048)),
                       norm_eps=float(model.model.norm.variance_epsilon), rope_layout=HALVES,
                       rope_bases=(0.0,) * layers, windows=(0,) * layers, qk_norm=config.model_type == "qwen3",
                       qkv_bias=attn.q_proj.bias is not None,
                       attn_scale=float(getattr(attn, "scaling", head_dim ** -0.5)))


class ModelRopeTables(RopeTables):
    """The model's own rotary embedding's cos/sin tables (one table for every layer)."""

    def __init__(self, spec: DecoderSpec, rotary, probe: torch.Tensor):
        self._rotary, self._probe = rotary, probe
        super().__init__(spec)

    def extend(self, upto: int) -> None:
        if upto <= self._have:
            return
        upto = min(self.spec.context, max(upto, 2 * self._have))
        with torch.inference_mode():
            cos, sin = self._rotary(self._probe, torch.arange(upto)[None])
        self._tables = [(cos[0].float().contiguous(), sin[0].float().contiguous())]
        self._have = upto


def StaticDecoder(model, *, gemm: str = "auto", widths: Iterable[int] = range(1, 10), exact_rows: bool = True,
                  native_ops: bool = True) -> Decoder:
    """The decoder over ``model``'s weights (see the module docstring). ``gemm``: "auto" (measure oneDNN
    against MKL), "onednn" or "mkl". ``native_ops``: the C kernels where they build (False: torch ops)."""
    reason = unsupported_reason(model)
    if reason:
        raise ValueError(f"the static decoder cannot run this model: {reason}")
    spec = spec_of(model)
    inner = model.model
    layers = []
    with torch.no_grad():
        for layer in inner.layers:
            a, m = layer.self_attn, layer.mlp
            layers.append(LayerWeights(
                attn_norm=layer.input_layernorm.weight.detach(), qkv=_merged([a.q_proj, a.k_proj, a.v_proj]),
                o=DenseWeight(a.o_proj.weight), ffn_norm=layer.post_attention_layernorm.weight.detach(),
                gate_up=_merged([m.gate_proj, m.up_proj]), down=DenseWeight(m.down_proj.weight),
                q_norm=a.q_norm.weight.detach() if spec.qk_norm else None,
                k_norm=a.k_norm.weight.detach() if spec.qk_norm else None))
        weights = DecoderWeights(DenseWeight(inner.embed_tokens.weight), layers, inner.norm.weight.detach(),
                                 DenseWeight(model.get_output_embeddings().weight))
    rope = ModelRopeTables(spec, inner.rotary_emb, inner.embed_tokens.weight[:1])
    return Decoder(spec, weights, backends.backend(native_ops), exact_rows=exact_rows, gemm=gemm, widths=widths,
                   rope=rope)
