"""Row-wise attention for verify blocks: a block row's attention is computed exactly as a plain step's.

transformers' SDPA path takes a different route for one query row (GQA heads packed as rows, no
mask) than for several (``repeat_kv``/``enable_gqa`` and a causal mask), so the logits of the token
at block position i differ in the last bits from what a width-1 plain step would compute for the same
token (about 3e-5 on SmolLM2-135M). Together with a row-independent GEMM (``fast_linear``, oneDNN on
packed weights), computing each query row of a small block with the width-1 call makes every row of a
verify block bit-identical to plain decoding: greedy speculative output then equals plain decoding
exactly, not just "up to ties in the last bit".

``rowwise_attention`` is registered with transformers' ``AttentionInterface`` as ``"tandem_rowwise"``:
  * q_len == 1, or q_len > ``ROWWISE_MAX_ROWS`` (prefill): transformers' ``sdpa_attention_forward``
    unchanged (mask and all);
  * 1 < q_len <= ROWWISE_MAX_ROWS: row i attends to the first kv_len - q_len + i + 1 keys, through the
    same single-row SDPA call a plain step makes (no mask: batch 1, no padding, a causal prefix).
It assumes batch 1 without padding (how the verifier calls the model; it falls back to SDPA otherwise)
and a cache that returns exactly the cached keys (DynamicCache, as the Target uses), not a preallocated
StaticCache (whose key length is its capacity).
"""

from __future__ import annotations

import torch

ROWWISE = "tandem_rowwise"
ROWWISE_MAX_ROWS = 32


def rowwise_attention(module, query, key, value, attention_mask, dropout: float = 0.0, scaling=None,
                      is_causal=None, **kwargs):
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    q_len = query.shape[2]
    if q_len == 1 or q_len > ROWWISE_MAX_ROWS or query.shape[0] != 1 or kwargs.get("sliding_window"):
        if q_len == 1 and query.shape[0] == 1:
            attention_mask = None        # a single last query sees every key: what the row path does too
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      is_causal=is_causal, **kwargs)
    past = key.shape[2] - q_len
    rows = []
    for i in range(q_len):
        n = past + i + 1
        out, _ = sdpa_attention_forward(module, query[:, :, i:i + 1], key[:, :, :n], value[:, :, :n], None,
                                        dropout=dropout, scaling=scaling, is_causal=False, **kwargs)
        rows.append(out)                                                   # [1, 1, heads, head_dim]
    return torch.cat(rows, dim=1), None                                    # [1, q_len, heads, head_dim]


_registered = False


def register() -> str:
    """Registers ``"tandem_rowwise"`` (attention + the SDPA mask builder) with transformers; returns the name."""
    global _registered
    if not _registered:
        from transformers import AttentionInterface
        from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

        AttentionInterface.register(ROWWISE, rowwise_attention)
        ALL_MASK_ATTENTION_FUNCTIONS.register(ROWWISE, sdpa_mask)
        _registered = True
    return ROWWISE


def use_rowwise_attention(model, on: bool = True) -> str:
    """Switches ``model`` (an sdpa model) to row-wise attention for small blocks, or back to sdpa;
    returns the implementation now in use."""
    name = register() if on else "sdpa"
    current = getattr(model.config, "_attn_implementation", None)
    if current not in ("sdpa", ROWWISE, None):
        return current                   # eager / flash / flex: left alone
    try:
        model.set_attn_implementation(name)
    except Exception:                    # noqa: BLE001 - older API: set the config field directly
        model.config._attn_implementation = name
    return getattr(model.config, "_attn_implementation", name)
