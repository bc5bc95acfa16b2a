"""``--activations auto`` (the default): which arithmetic the verifier runs a GGUF file's blocks in, from the
file's own block types.

The two arithmetics (``quant``): 'fp32' rebuilds each weight exactly and multiplies it in fp32 (transformers'
forward of the file, to fp32 rounding); 'int8' rounds each row of activations to int8 per 32 values and
multiplies in integers, as llama.cpp does. Speculation is lossless under both: every row of a verify block
is computed as a plain step computes it, so speculative output is the chosen arithmetic's plain decoding.

What fp32 costs depends on the block type. Q4_0/Q4_1/Q8_0 rebuild in a few instructions a chunk (a
table lookup or a conversion, fp32 scales), F16/BF16/F32 in one; the 5-bit and K-quant types (Q5_0, Q5_1,
Q4_K, Q5_K, Q6_K) take their fifth bit, six-bit scales or split nibbles apart first and rebuild at half
the weights a second or less (``verifier_service/kernels/bench_gemm.py``), while their int8 kernels read the
integers as they are. On a file whose layers are mostly those types, fp32 made plain decoding 0.4x
llama.cpp's on the same file (a 1.5 B Q4_K_M file: an 83 ms forward against int8's 33 and llama-bench's
34 ms a token) and verify blocks of 4-8 rows 1.7-2.5x int8's (Gemma 3 270M Q4_K_M; BENCHMARKS.md,
thirty-seventh session). So 'auto' picks int8 when more than ``SHARE`` of the layers' weight bytes are of
those types, else fp32 (the default target, Q4_1: fp32).

The choice reads the file, not a timing: the same file gives the same arithmetic, so the same text, on
every start. ``--activations fp32`` or ``int8`` (``TANDEM_ACTIVATIONS``) pins it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from verifier_service import quant

SLOW_FP32_KINDS = ("Q5_0", "Q5_1", "Q4_K", "Q5_K", "Q6_K")   # fp32 rebuilds them at half int8's pace or less
SHARE = 0.5                                                   # of the layers' weight bytes
NOT_LAYERS = ("token_embd.weight", "output.weight")           # the embedding and the head


def choose(layer_bytes: Mapping[str, int]) -> tuple[str, str]:
    """'int8' or 'fp32' for layers of ``layer_bytes`` ({block type: bytes}), and why, for the start-up line."""
    total = sum(layer_bytes.values())
    slow = {k: b for k, b in layer_bytes.items() if k in SLOW_FP32_KINDS}
    share = sum(slow.values()) / total if total else 0.0
    kinds = "/".join(sorted(slow, key=slow.get, reverse=True))
    if share > SHARE:
        return "int8", (f"auto: {share:.0%} of the layers' weights are {kinds} blocks, which fp32 rebuilds at half "
                        "int8's pace or less; --activations fp32 for transformers' arithmetic")
    return "fp32", (f"auto: {share:.0%} of the layers' weights are 5-bit or K-quant blocks"
                    if share else "auto: no 5-bit or K-quant layers")


def layer_bytes(file) -> dict[str, int]:
    """{block type: bytes} of a GGUF file's matrices (a ``gguf_file.GgufFile``), the embedding and the head left
    out: the layers are where the two arithmetics differ in cost at every width."""
    return file.matrix_bytes(skip=NOT_LAYERS)


def settle(file, environ=os.environ) -> str:
    """Settles 'auto' for ``file`` (a ``gguf_file.GgufFile``) before its weights load: sets ``TANDEM_ACTIVATIONS``
    (the process's arithmetic, read by every weight as ``--activations`` sets it) to the choice and returns its
    reason; '' where the mode was pinned (fp32 or int8, or nothing asked: nothing to settle)."""
    if quant.activation_mode(environ.get(quant.ACTIVATIONS_ENV, "")) != quant.AUTO:
        return ""
    mode, why = choose(layer_bytes(file))
    environ[quant.ACTIVATIONS_ENV] = mode
    return why
