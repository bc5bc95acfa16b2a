"""Shrinks an exported drafter graph: int8 (dynamic int8 weights, ONNX Runtime's ``quantize_dynamic``),
int4 (block-wise 4-bit weights: MatMulNBits and GatherBlockQuantized) or fp16 (half-precision weights
and compute, float32 inputs and outputs).

The quantized graph keeps the decoder-with-past interface; ``tandem.export`` reports its parity with
torch but does not enforce it. onnx and onnxruntime are imported lazily.
"""

from __future__ import annotations

from pathlib import Path

QUANTIZE_MODES = ("int8", "int4", "fp16")
INT4_BLOCK = 32          # MatMul weights: blocks of 32 inputs (as GGUF Q4_0/Q4_1)
INT4_EMBED_BLOCK = 128   # the embedding table


def quantize(src: Path, dst: Path, mode: str, external: bool = False) -> None:
    """Writes ``dst``, the ONNX model ``src`` with its weights quantized by ``mode`` (one of ``QUANTIZE_MODES``)."""
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
