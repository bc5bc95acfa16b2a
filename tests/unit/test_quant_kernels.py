"""The C kernels on every ISA path this CPU runs (verifier_service.quant over native: avx512, avx2, generic).

A tiny GGUF file holds one weight of each block type the kernels read, written with gguf-py's GGUFWriter
(quantized by gguf-py where it can; K-quant blocks, which gguf-py cannot make, are random bytes with sane
fp16 scales) and read back through GGUFReader's memory map. gguf-py's dequantizer is the oracle: the
transformers weights are its output. On each path:
  * rows() / dequantize() are gguf-py's values bit for bit, and so are the weights the GEMM rebuilds (an
    identity input makes each output a single weight: the sum adds only zeros);
  * the GEMM equals the fp32 product within the forward error bound of any summation order,
    |y - y_exact| <= (inner + 2) 2^-24 (|x| |W|^T + |b|) (2^-24: fp32's unit roundoff; inner products, one
    bias add), checked against a float64 product of the same weights;
  * a row's output is bit-identical at every block width 1-8, any offset, and 1 or 2 threads;
  * attention and the glue match torch's formulas to fp32 rounding, with exact rows.
Where this CPU lacks AVX-512 the avx512 path runs its unchanged sources compiled against SIMDe, a header-only
emulation of the intrinsics (Debian libsimde-dev; avx512_emulation.h fills in the few it lacks): its
arithmetic then differs from the hardware's only inside reductions and FMAs (emulated as a product and a sum),
so everything above still holds. Paths neither the CPU nor the emulation can run are reported as skipped."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from verifier_service import native
from verifier_service.quant import INT8_KINDS, KINDS, SCALED_KINDS, X8_KINDS, Ops, QuantWeight, SideBySide

pytestmark = pytest.mark.skipif(native.library() is None, reason=f"C kernels unavailable: {native.unavailable_reason()}")

OUT, INNER = 40, 512          # 40 output rows: not a multiple of the row or thread blocking; 2 K-quant super-blocks
LONG_OUT, LONG_INNER = 37, 2304   # past TWO_COLUMN_MIN_INNER (1 024): the two-column passes; 9 super-blocks, and
                                  # past HALF_MIN_INNER (2 048): the K-quants' half passes from 8 rows
U = 2.0 ** -24


SIMDE = Path("/usr/include/simde/x86/avx512.h")
EMULATED = tuple(i for i in ("avx512", "avx512vnni") if i in native.built_isas() and i not in native.runnable_isas())


def isa_param(which: str):
    runs = which in native.runnable_isas() or (which in EMULATED and SIMDE.exists())
    why = f"this CPU does not run the {which} path" + (" and SIMDe (libsimde-dev) is not installed to emulate it"
                                                        if which in EMULATED else "")
    return pytest.param(which, id=which, marks=pytest.mark.skipif(not runs, reason=why))


ISAS = [isa_param(i) for i in native.ISAS]


@pytest.fixture(scope="module")
def emulated_kernels(tmp_path_factory):
    """The library with the avx512 (and avx512vnni) sources compiled against SIMDe (the others as native builds
    them), without OpenMP: the kernels of the 'avx512' path on a CPU without AVX-512. Its GEMM instances cover
    passes of up to 2 rows (-DROWS=2: the same per-row code, a quarter of the emulated compile time)."""
    import ctypes

    build = tmp_path_factory.mktemp("avx512_emulation")
    shutil.copy(Path(__file__).with_name("avx512_emulation.h"), build / "immintrin.h")
    cc = shutil.which("cc") or shutil.which("gcc")
    objects, jobs = [], []
    for which in native.built_isas():
        for name in native.SOURCES[which]:
            flags = [f"-I{build}", "-DROWS=2"] if which in EMULATED else list(native.ISA_CFLAGS[which])
            objects.append(build / (Path(name).stem + ".o"))
            jobs.append(subprocess.Popen([cc, "-O1", "-ffp-contract=off", "-fPIC", *flags, f"-I{native.KERNELS}", "-c",
                                          str(native.KERNELS / name), "-o", str(objects[-1])],
                                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE))
    for job in jobs:
        assert job.wait() == 0, job.stderr.read().decode()[-2000:]
    lib = build / "libemulated.so"
    subprocess.run([cc, "-shared", *map(str, objects), "-o", str(lib), "-lm"], check=True, capture_output=True)
    lib = ctypes.CDLL(str(lib))
    native._declare(lib)
    return {which: native.Kernels(lib, which) for which in EMULATED}


@pytest.fixture(autouse=True)
def emulated_path(request, monkeypatch):
    """A test of an emulated path gets its kernels from ``emulated_kernels`` (native.kernels patched)."""
    which = getattr(request.node, "callspec", None) and request.node.callspec.params.get("which")
    if which in EMULATED:
        kernels = request.getfixturevalue("emulated_kernels")
        real = native.kernels
        monkeypatch.setattr(native, "kernels", lambda isa=None: kernels[isa] if isa in kernels else real(isa))


@pytest.fixture(autouse=True)
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _k_quant_blocks(kind, rng, out=OUT, inner=INNER) -> np.ndarray:
    """Random K-quant blocks [out, bytes a row] with finite fp16 scales of a weight's magnitude."""
    import gguf

    block, size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[kind]]
    nb = inner // block
    raw = rng.integers(0, 256, size=(out, nb, size), dtype=np.uint8)

    def half(lo, hi):
        return rng.uniform(lo, hi, (out, nb)).astype(np.float16).view(np.uint8).reshape(out, nb, 2)

    if kind == "Q6_K":
        raw[..., size - 2:] = half(-0.01, 0.01)                  # d, last
    else:
        raw[..., 0:2], raw[..., 2:4] = half(0, 0.01), half(0, 0.01)    # d, dmin
    return raw.reshape(out, nb * size)


@pytest.fixture(scope="module")
def gguf_weights(tmp_path_factory):
    """{kind: (raw blocks as GGUFReader maps them, gguf-py's fp32 weights [OUT, INNER])}."""
    return _kinds_file(tmp_path_factory.mktemp("quant") / "kinds.gguf", OUT, INNER)


@pytest.fixture(scope="module")
def long_gguf_weights(tmp_path_factory):
    """As ``gguf_weights`` with rows long enough for the two-column passes (TWO_COLUMN_MIN_INNER) and an odd
    number of them (a tile's last column alone)."""
    return _kinds_file(tmp_path_factory.mktemp("quant_long") / "kinds.gguf", LONG_OUT, LONG_INNER)


def _kinds_file(path, out, inner):
    import gguf

    rng = np.random.default_rng(7)
    writer = gguf.GGUFWriter(str(path), "llama")
    for kind in KINDS:
        qtype = gguf.GGMLQuantizationType[kind]
        if kind.endswith("_K"):
            writer.add_tensor(kind, _k_quant_blocks(kind, rng, out, inner), raw_dtype=qtype)
            continue
        values = (rng.standard_normal((out, inner)) * 0.05).astype(np.float32)
        if kind == "F32":
            writer.add_tensor(kind, values)
        elif kind == "F16":
            writer.add_tensor(kind, values.astype(np.float16))
        else:
            writer.add_tensor(kind, gguf.quants.quantize(values, qtype), raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    reader = gguf.GGUFReader(str(path))
    kinds = {}
    for t in reader.tensors:
        assert [int(s) for s in t.shape] == [inner, out]
        ref = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32).reshape(out, inner)
        kinds[t.name] = (t.data, torch.from_numpy(ref.copy()))
    kinds["_reader"] = reader                                     # keeps the map open
    return kinds


def weight(gguf_weights, kind, which) -> tuple[QuantWeight, torch.Tensor]:
    raw, ref = gguf_weights[kind]
    return QuantWeight(kind, raw, OUT, INNER, isa=which), ref


@pytest.mark.parametrize("which", ISAS)
@pytest.mark.parametrize("kind", KINDS)
def test_rows_and_rebuilt_weights_are_gguf_py_values(gguf_weights, kind, which):
    w, ref = weight(gguf_weights, kind, which)
    assert w.nbytes == gguf_weights[kind][0].nbytes                        # the file's bytes, not a copy
    assert torch.equal(w.dequantize(), ref)
    ids = [39, 0, 7, 7, 21]
    assert torch.equal(w.rows(ids), ref[ids])
    assert torch.equal(w.rows(torch.tensor([3])), ref[3:4])
    # x = identity: y[i, o] = W[o, i] exactly (one product by 1, then sums of zeros)
    assert torch.equal(w.matmul(torch.eye(INNER)).T, ref)


@pytest.mark.parametrize("which", ISAS)
@pytest.mark.parametrize("kind", KINDS)
def test_gemm_equals_the_fp32_product_within_rounding(gguf_weights, kind, which):
    w, ref = weight(gguf_weights, kind, which)
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(19, INNER, generator=gen)
    bias = torch.randn(OUT, generator=gen)
    y = w.matmul(x, bias)
    exact = x.double() @ ref.double().T + bias.double()
    bound = (INNER + 2) * U * (x.double().abs() @ ref.double().abs().T + bias.double().abs())
    assert ((y.double() - exact).abs() <= bound).all(), float(((y.double() - exact).abs() / bound).max())
    torch_fp32 = F.linear(x, ref, bias).double()                 # torch's own fp32 GEMM obeys the same bound
    assert ((torch_fp32 - exact).abs() <= bound).all()
    assert ((y.double() - torch_fp32).abs() <= 2 * bound).all()


@pytest.mark.parametrize("which", ISAS)
@pytest.mark.parametrize("kind", KINDS)
def test_rows_do_not_depend_on_width_or_threads(gguf_weights, kind, which):
    w, _ = weight(gguf_weights, kind, which)
    x = torch.randn(11, INNER, generator=torch.Generator().manual_seed(2))
    full = w.matmul(x)
    for width in range(1, 9):
        for first in (0, 3, 11 - width):
            assert torch.equal(w.matmul(x[first:first + width]), full[first:first + width]), (width, first)
    torch.set_num_threads(2)
    assert torch.equal(w.matmul(x), full)
    assert torch.equal(w.matmul(x[5:6]), full[5:6])
    into = torch.zeros(11, OUT + 8)
    w.matmul(x, out=into[:, 4:4 + OUT])                 # strided output rows: a column slice
    assert torch.equal(into[:, 4:4 + OUT], full) and not into[:, :4].any() and not into[:, 4 + OUT:].any()
    # a prompt chunk or a shared forward: up to 33 rows, several row groups through each tile of columns
    wide = torch.randn(33, INNER, generator=torch.Generator().manual_seed(4))
    assert torch.equal(w.matmul(wide)[[0, 8, 17, 32]], torch.cat([w.matmul(wide[i:i + 1]) for i in (0, 8, 17, 32)]))


@pytest.mark.parametrize("which", ISAS)
@pytest.mark.parametrize("kind", KINDS)
def test_long_rows_two_columns_a_pass_keep_every_rows_bits(long_gguf_weights, kind, which):
    """Rows of 2 304 weights: from two rows of x up, a path may compute two columns a pass, and a K-quant from
    eight rows up two columns in two half passes (AVX-512); every row must keep the bits of the same row alone
    (one column a pass), at any width and thread count."""
    raw, ref = long_gguf_weights[kind]
    w = QuantWeight(kind, raw, LONG_OUT, LONG_INNER, isa=which)
    x = torch.randn(33, LONG_INNER, generator=torch.Generator().manual_seed(5))
    alone = torch.cat([w.matmul(x[i:i + 1]) for i in range(33)])
    for width in (2, 3, 4, 5, 8, 9, 33):
        assert torch.equal(w.matmul(x[:width]), alone[:width]), width
    torch.set_num_threads(2)
    assert torch.equal(w.matmul(x), alone)
    bias = torch.randn(LONG_OUT, generator=torch.Generator().manual_seed(6))
    assert torch.equal(w.matmul(x[:6], bias), torch.cat([w.matmul(x[i:i + 1], bias) for i in range(6)]))
    exact = x.double() @ ref.double().T
    bound = (LONG_INNER + 2) * U * (x.double().abs() @ ref.double().abs().T)
    assert ((alone.double() - exact).abs() <= bound).all()


@pytest.mark.parametrize("which", ISAS)
@pytest.mark.parametrize("kind", SCALED_KINDS)
def test_fp32_scale_copy_gives_the_files_blocks_bits(gguf_weights, kind, which):
    """With fp32 activations a legacy weight is read from a copy of its blocks whose scales are fp32 (one
    broadcast load a scale instead of a conversion): every output, at every width and thread count, and every
    row it gives are those of the file's own blocks, bit for bit. int8 activations keep the file's blocks."""
    import gguf

    raw, ref = gguf_weights[kind]
    copy = QuantWeight(kind, raw, OUT, INNER, isa=which)
    blocks = QuantWeight(kind, raw, OUT, INNER, isa=which, scaled=False)
    assert copy.scaled is not None and blocks.scaled is None
    size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[kind]][1]
    assert copy.scaled.shape == (OUT, INNER // 32 * (size + (4 if kind in ("Q4_1", "Q5_1") else 2)))
    gen = torch.Generator().manual_seed(5)
    x, bias = torch.randn(12, INNER, generator=gen), torch.randn(OUT, generator=gen)
    for threads in (1, 2):
        torch.set_num_threads(threads)
        for width in (1, 2, 3, 4, 5, 8, 9, 12):
            assert torch.equal(copy.matmul(x[:width], bias), blocks.matmul(x[:width], bias)), (threads, width)
    ids = [39, 0, 7, 7, 21]
    assert torch.equal(copy.rows(ids), ref[ids]) and torch.equal(copy.dequantize(), ref)
    assert QuantWeight(kind, raw, OUT, INNER, isa=which, activations="int8").scaled is None


@pytest.mark.parametrize("which", ISAS)
def test_weights_side_by_side_are_each_weights_own_product(gguf_weights, which):
    """q, k, v (or gate, up) in one kernel call: every column bit-identical to its weight's own matmul, at
    every width and thread count, parts of different block types mixed (a Q4_K_M file's q/k/v)."""
    kinds = ["Q4_K", "Q6_K", "Q8_0", "Q4_1"]
    parts = [weight(gguf_weights, kind, which)[0] for kind in kinds]
    side = SideBySide(parts)
    assert side.out == len(kinds) * OUT
    x = torch.randn(11, INNER, generator=torch.Generator().manual_seed(3))
    own = torch.cat([p.matmul(x) for p in parts], dim=1)
    for threads in (1, 2):
        torch.set_num_threads(threads)
        assert torch.equal(side.matmul(x), own)
        for width in (1, 2, 5, 8):
            assert torch.equal(side.matmul(x[2:2 + width]), own[2:2 + width]), (threads, width)
    into = torch.zeros(3, side.out + 4)
    side.matmul(x[:3], out=into[:, 2:2 + side.out])
    assert torch.equal(into[:, 2:2 + side.out], own[:3]) and not into[:, :2].any() and not into[:, -2:].any()
    with pytest.raises(ValueError):
        SideBySide(parts * 3)                                  # more than 8 parts


def test_paths_agree_within_rounding(gguf_weights):
    x = torch.randn(3, INNER, generator=torch.Generator().manual_seed(3))
    for kind in KINDS:
        ys = [weight(gguf_weights, kind, i)[0].matmul(x) for i in native.runnable_isas()]
        ref = gguf_weights[kind][1].double()
        bound = 2 * (INNER + 2) * U * (x.double().abs() @ ref.abs().T)
        for y in ys[1:]:
            assert ((y.double() - ys[0].double()).abs() <= bound).all(), kind


def test_bad_weights_and_isas_are_refused(gguf_weights, monkeypatch):
    raw, _ = gguf_weights["Q4_K"]
    with pytest.raises(ValueError, match="not whole"):
        QuantWeight("Q4_K", raw[:, :72], OUT, 128)                     # 128 weights: half a super-block
    with pytest.raises(ValueError, match="raw blocks must be"):
        QuantWeight("Q4_K", raw[:, :144], OUT, INNER)
    with pytest.raises(ValueError, match="IQ2_XXS"):
        QuantWeight("IQ2_XXS", raw, OUT, INNER)
    monkeypatch.setenv(native.ENV, "generic")
    assert native.isa() == "generic" and native.library().isa == "generic"
    assert QuantWeight("Q4_K", raw, OUT, INNER).isa == "generic"
    monkeypatch.setenv(native.ENV, "sse9")
    with pytest.raises(ValueError, match="--isa 'sse9'"):
        native.isa()
    missing = [i for i in native.built_isas() if i not in native.runnable_isas()]
    if missing:                                   # a path this CPU lacks: the error names the flag and the fix
        monkeypatch.setenv(native.ENV, missing[0])
        with pytest.raises(ValueError, match=f"--isa {missing[0]} \\(TANDEM_ISA={missing[0]}\\): this CPU lacks"):
            native.isa()
    monkeypatch.setenv(native.ENV, "auto")
    assert native.isa() == native.runnable_isas()[0]


# ---- int8 activations (kernels/gemm_q8.h) --------------------------------------------------------------
def int8_weight(gguf_weights, kind, which) -> tuple[QuantWeight, torch.Tensor]:
    raw, ref = gguf_weights[kind]
    return QuantWeight(kind, raw, OUT, INNER, isa=which, activations="int8"), ref


def rounded_activations(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """gemm_q8.h's rounding of x [n, inner] per 32 values, in numpy fp32: the values it stands for (q * d)
    and each value's block scale d."""
    xb = x.numpy().reshape(x.shape[0], -1, 32)
    d = (np.abs(xb).max(-1, keepdims=True) / np.float32(127)).astype(np.float32)
    inv = np.where(d != 0, np.float32(1) / np.where(d != 0, d, np.float32(1)), np.float32(0)).astype(np.float32)
    q = np.rint((xb * inv).astype(np.float32))                                   # numpy rounds half to even
    assert np.abs(q).max() <= 127
    return torch.from_numpy((q * d).reshape(x.shape)), torch.from_numpy(np.broadcast_to(d, xb.shape).reshape(x.shape))


@pytest.mark.parametrize("which", ISAS)
@pytest.mark.parametrize("kind", INT8_KINDS)
def test_int8_activations_are_llama_cpp_arithmetic(gguf_weights, kind, which):
    """x rounded to int8 per 32 values, times the exact weights: the product of the rounded x within fp32
    summation rounding, and the fp32 product within what the rounding of x can move it (half a step a value)."""
    w, ref = int8_weight(gguf_weights, kind, which)
    assert w.activations == "int8"
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(9, INNER, generator=gen)
    x[3, :32] = 0.0                                                               # a block of zeros: d = 0
    bias = torch.randn(OUT, generator=gen)
    y = w.matmul(x, bias).double()
    xq, d = rounded_activations(x)
    exact = xq.double() @ ref.double().T + bias.double()
    bound = (INNER + 4) * U * (xq.double().abs() @ ref.double().abs().T + bias.double().abs())
    assert ((y - exact).abs() <= bound).all(), float(((y - exact).abs() / bound).max())
    fp32 = x.double() @ ref.double().T + bias.double()
    moved = (d.double() / 2) @ ref.double().abs().T                            # |x - xq| <= d / 2 a value
    assert ((y - fp32).abs() <= moved + bound).all()
    assert not torch.equal(w.matmul(x), weight(gguf_weights, kind, which)[0].matmul(x))   # not the fp32 path


@pytest.mark.parametrize("which", ISAS)
def test_int8_rows_are_exact_and_the_same_on_every_path(gguf_weights, which):
    """A row's int8 result is bit-identical at every width and thread count, side by side or alone, and on
    every ISA path and layout (integers are exact and the fp32 steps run in one order everywhere; not checked
    across paths or layouts on an emulated path, whose vector FMAs are a product and a sum)."""
    x = torch.randn(11, INNER, generator=torch.Generator().manual_seed(6))
    for kind in INT8_KINDS:
        w, _ = int8_weight(gguf_weights, kind, which)
        assert (w.x8 is not None) == (kind in X8_KINDS and which in native.X8_ISAS)   # 8 rows interleaved
        ref = gguf_weights[kind][1]
        assert torch.equal(w.rows([39, 0, 7, 7]), ref[[39, 0, 7, 7]]) and torch.equal(w.dequantize(), ref)
        full = w.matmul(x)
        if which not in EMULATED:
            assert torch.equal(full, int8_weight(gguf_weights, kind, "generic")[0].matmul(x)), kind
        for width in (1, 2, 3, 4, 5, 8):
            assert torch.equal(w.matmul(x[2:2 + width]), full[2:2 + width]), (kind, width)
        torch.set_num_threads(2)
        assert torch.equal(w.matmul(x), full) and torch.equal(w.matmul(x[4:5]), full[4:5]), kind
        torch.set_num_threads(1)
    mixed = (("Q4_K", "Q6_K", "Q8_0", "Q4_1", "Q5_1"),) if which not in EMULATED else ()   # x8 and not: one call
    for kinds in (*mixed, ("Q8_0", "Q4_1", "Q4_0", "Q5_0", "Q6_K")):                                        # all x8
        parts = [int8_weight(gguf_weights, kind, which)[0] for kind in kinds]
        side = SideBySide(parts)
        own = torch.cat([p.matmul(x) for p in parts], dim=1)
        for threads in (1, 2):
            torch.set_num_threads(threads)
            assert torch.equal(side.matmul(x), own), kinds
            assert torch.equal(side.matmul(x[6:7]), own[6:7]), kinds
        torch.set_num_threads(1)
    f16, _ = int8_weight(gguf_weights, "F16", which)
    assert f16.activations == "fp32"                                    # no int8 form: the fp32 kernel
    assert not SideBySide.accepts([parts[0], f16])                     # one arithmetic per kernel call
    with pytest.raises(ValueError, match="--activations 'int4'"):
        int8_weight(gguf_weights, "Q4_K", which)[0].__class__("Q4_K", gguf_weights["Q4_K"][0], OUT, INNER,
                                                              activations="int4")


@pytest.mark.parametrize("which", ISAS)
def test_int8_output_columns_do_not_depend_on_the_weight_around_them(gguf_weights, which):
    """The first 13 rows of a weight (not a multiple of the 8 weight rows a pass takes, so no x8 copy) give
    the first 13 columns of the whole weight's product bit for bit, bias included: each output is its own
    weight row's arithmetic, whatever rows share its pass or layout."""
    x = torch.randn(6, INNER, generator=torch.Generator().manual_seed(8))
    bias = torch.randn(OUT, generator=torch.Generator().manual_seed(9))
    for kind in INT8_KINDS:
        raw, _ = gguf_weights[kind]
        whole = QuantWeight(kind, raw, OUT, INNER, isa=which, activations="int8")
        part = QuantWeight(kind, np.ascontiguousarray(raw[:13]), 13, INNER, isa=which, activations="int8")
        assert part.x8 is None
        for width in (1, 3, 6):
            assert torch.equal(part.matmul(x[:width], bias[:13]), whole.matmul(x[:width], bias)[:, :13]), (kind, width)


# ---- attention and glue ------------------------------------------------------------------------------
def attention_reference(q, kv, start, scale, window):
    """Row i attends to positions max(0, p + 1 - window)..p, p = start + i, in float64."""
    n, heads, _ = q.shape
    group = heads // kv.shape[1]
    rows = []
    for i in range(n):
        end = start + i + 1
        begin = max(0, end - window) if window else 0
        keys = kv[0, :, begin:end].double().repeat_interleave(group, 0)           # [H, m, D]
        values = kv[1, :, begin:end].double().repeat_interleave(group, 0)
        p = torch.softmax(q[i].double()[:, None] @ keys.transpose(1, 2) * scale, -1)
        rows.append((p @ values).reshape(-1))
    return torch.stack(rows).float()


@pytest.mark.parametrize("which", ISAS)
@pytest.mark.parametrize("d,window", [(64, 0), (40, 0), (16, 5), (72, 37)])
def test_attention_matches_softmax_attention_and_rows_are_exact(which, d, window):
    ops = Ops(which)
    gen = torch.Generator().manual_seed(d + window)
    heads, kv_heads, cap, start, n = 6, 2, 160, 90, 8
    kv = torch.randn(2, kv_heads, cap, d, generator=gen)
    qkv = torch.randn(n, heads + 2 * kv_heads, d, generator=gen)
    q = qkv[:, :heads]                                         # a strided slice, as the decoder passes it
    scale = d ** -0.5
    full = ops.attention(q, kv[0], kv[1], start, scale, window)
    torch.testing.assert_close(full, attention_reference(q, kv, start, scale, window), rtol=1e-5, atol=1e-6)
    for width in range(1, n + 1):
        for first in (0, n - width):
            part = ops.attention(q[first:first + width], kv[0], kv[1], start + first, scale, window)
            assert torch.equal(part, full[first:first + width]), (width, first)
    torch.set_num_threads(2)
    assert torch.equal(ops.attention(q, kv[0], kv[1], start, scale, window), full)


def rows_exact(fn, x: torch.Tensor) -> torch.Tensor:
    """fn over all rows of x; asserts each row alone (and every width-3 window) gives the same bits."""
    full = fn(x)
    for i in range(x.shape[0]):
        assert torch.equal(fn(x[i:i + 1]), full[i:i + 1]), i
    for first in range(x.shape[0] - 2):
        assert torch.equal(fn(x[first:first + 3]), full[first:first + 3]), first
    return full


@pytest.mark.parametrize("which", ISAS)
def test_gated_products_match_torch(which):
    ops = Ops(which)
    gate_up = torch.randn(6, 2 * 301, generator=torch.Generator().manual_seed(4)) * 3   # 301: SIMD tails
    gate, up = gate_up[:, :301], gate_up[:, 301:]
    silu = rows_exact(ops.silu_mul, gate_up)
    torch.testing.assert_close(silu, F.silu(gate) * up, rtol=2e-6, atol=1e-6)
    gelu = rows_exact(ops.gelu_tanh_mul, gate_up)
    torch.testing.assert_close(gelu, F.gelu(gate, approximate="tanh") * up, rtol=2e-6, atol=2e-6)


@pytest.mark.parametrize("which", ISAS)
def test_norms_and_rope_match_transformers_formulas(which):
    ops = Ops(which)
    gen = torch.Generator().manual_seed(5)
    n, heads, kv_heads, d, cap, start, hidden = 5, 4, 2, 24, 32, 9, 200
    x = torch.randn(n, hidden, generator=gen)
    res = torch.randn(n, hidden, generator=gen)
    w = torch.randn(hidden, generator=gen)

    def rms(t, weight, eps):                 # LlamaRMSNorm / Qwen3RMSNorm in float32
        return weight * (t * torch.rsqrt(t.pow(2).mean(-1, keepdim=True) + eps))

    xs = x.clone()
    h = ops.add_rms_norm(xs, res, w, 1e-6)
    assert torch.equal(xs, x + res)
    torch.testing.assert_close(h, rms(x + res, w, 1e-6), rtol=1e-5, atol=1e-6)
    assert torch.equal(ops.add_rms_norm(xs[2:3].clone(), None, w, 1e-6), h[2:3])     # a row alone: same bits

    qkv = torch.randn(n, (heads + 2 * kv_heads) * d, generator=gen)
    qw, kw = torch.randn(d, generator=gen), torch.randn(d, generator=gen)
    normed = qkv.clone()
    ops.head_rms_norm(normed[:, :heads * d].view(n, heads, d), qw, 1e-6)
    ops.head_rms_norm(normed[:, heads * d:(heads + kv_heads) * d].view(n, kv_heads, d), kw, 1e-6)
    want = qkv.view(n, heads + 2 * kv_heads, d).clone()
    want[:, :heads] = rms(want[:, :heads], qw, 1e-6)
    want[:, heads:heads + kv_heads] = rms(want[:, heads:heads + kv_heads], kw, 1e-6)
    torch.testing.assert_close(normed, want.view(n, -1), rtol=1e-5, atol=1e-6)

    angles = (torch.arange(start, start + n)[:, None] * 0.37 ** torch.arange(d // 2)).float()
    cos, sin = torch.cat([angles.cos()] * 2, 1), torch.cat([angles.sin()] * 2, 1)      # transformers' layout
    k_cache, v_cache = torch.zeros(kv_heads, cap, d), torch.zeros(kv_heads, cap, d)
    q = ops.rope_store(qkv, heads, kv_heads, cos, sin, k_cache, v_cache, start)
    parts = qkv.view(n, heads + 2 * kv_heads, d)

    def rope(t):                                                                       # t [n, h, d]
        rotated = torch.cat((-t[..., d // 2:], t[..., :d // 2]), -1)
        return t * cos[:, None] + rotated * sin[:, None]

    assert torch.equal(q.view(n, heads, d), rope(parts[:, :heads]))                    # torch's rounding: equal bits
    assert torch.equal(k_cache[:, start:start + n], rope(parts[:, heads:heads + kv_heads]).transpose(0, 1))
    assert torch.equal(v_cache[:, start:start + n], parts[:, heads + kv_heads:].transpose(0, 1))
    assert not k_cache[:, :start].any() and not k_cache[:, start + n:].any()
    # interleaved pairs (a GGUF Llama file's q/k row order) give the same numbers, permuted
    perm = torch.stack([torch.arange(d // 2), torch.arange(d // 2) + d // 2], 1).reshape(-1)   # file row -> halves row
    file_qkv = parts.clone()
    file_qkv[:, :heads + kv_heads] = parts[:, :heads + kv_heads, perm]
    k2, v2 = torch.zeros_like(k_cache), torch.zeros_like(v_cache)
    q2 = ops.rope_store(file_qkv.view(n, -1), heads, kv_heads, cos, sin, k2, v2, start, interleaved=True)
    assert torch.equal(q2.view(n, heads, d), q.view(n, heads, d)[..., perm])
    assert torch.equal(k2[..., perm.argsort()], k_cache) and torch.equal(v2, v_cache)


# ---- the int8 x8 GEMM picked per type and row count (verifier_service/x8_pick.py) -----------------------------
PICKABLE = len(native.x8_isas()) > 1
needs_pick = pytest.mark.skipif(not PICKABLE, reason="this CPU runs one x8 path: nothing to pick")


@pytest.fixture
def mixed_x8_table():
    """Every x8 type's calls alternate between this CPU's x8 paths by row count (1 row the last path, 2 the
    first, 3-4 the last, 5-8 the second, wider the first); the flags' path everywhere afterwards."""
    from verifier_service import x8_pick

    isas = native.x8_isas()
    mixed = {1: isas[-1], 2: isas[0], 4: isas[-1], 8: isas[1], 32: isas[0]}
    for kind in X8_KINDS:
        x8_pick.install(kind, mixed)
    yield mixed
    for kind in X8_KINDS:
        x8_pick.install(kind, {1: isas[0]})


@needs_pick
def test_picked_x8_paths_keep_rows_exact(gguf_weights, mixed_x8_table):
    """With each row count on another x8 path, a row's result is still bit-identical at every width, alone or
    side by side, and equal to the portable path's: the paths compute the same bits, so the pick is speed only."""
    x = torch.randn(11, INNER, generator=torch.Generator().manual_seed(8))
    parts = []
    for kind in X8_KINDS:
        raw, _ = gguf_weights[kind]
        w = QuantWeight(kind, raw, OUT, INNER, activations="int8")           # isa None: the picked entry points
        assert w._kernels.picked and w.x8 is not None
        full = w.matmul(x)
        assert torch.equal(full, int8_weight(gguf_weights, kind, "generic")[0].matmul(x)), kind
        for width in range(1, 9):
            assert torch.equal(w.matmul(x[1:1 + width]), full[1:1 + width]), (kind, width)
        torch.set_num_threads(2)
        assert torch.equal(w.matmul(x[4:5]), full[4:5]) and torch.equal(w.matmul(x[:3]), full[:3]), kind
        torch.set_num_threads(1)
        parts.append(w)
    side = SideBySide(parts[:5])
    own = torch.cat([p.matmul(x) for p in parts[:5]], dim=1)
    for width in (1, 2, 3, 6, 11):
        assert torch.equal(side.matmul(x[:width]), own[:width]), width


@needs_pick
def test_pick_times_every_x8_path_and_installs_the_fastest(gguf_weights, mixed_x8_table):
    from verifier_service import x8_pick

    weights = [QuantWeight(kind, gguf_weights[kind][0], OUT, INNER, activations="int8") for kind in ("Q4_K", "Q8_0")]
    weights.append(QuantWeight("Q5_1", gguf_weights["Q5_1"][0], OUT, INNER, activations="int8"))   # no x8 copy
    choices = x8_pick.pick(weights, threads=1, widths=(1, 3), repeats=1)
    assert set(choices) == {"Q4_K", "Q8_0"}
    assert all(set(c) == {1, 3} and set(c.values()) <= set(native.x8_isas()) for c in choices.values())
    line = x8_pick.describe(choices)
    assert line.startswith("Q4_K: ") and "; Q8_0: " in line
    x = torch.randn(3, INNER, generator=torch.Generator().manual_seed(9))
    assert torch.equal(weights[0].matmul(x), int8_weight(gguf_weights, "Q4_K", "generic")[0].matmul(x))


def test_forcing_an_isa_picks_nothing(gguf_weights, monkeypatch):
    """TANDEM_ISA (--isa) names the path every call runs: no table, no measurement."""
    from verifier_service import x8_pick

    monkeypatch.setenv(native.ENV, native.x8_isas()[0] if native.x8_isas() else "generic")
    w = QuantWeight("Q4_K", gguf_weights["Q4_K"][0], OUT, INNER, activations="int8")
    assert not w._kernels.picked
    assert x8_pick.pick([w], threads=1, widths=(1,), repeats=1) == {}


def test_describe_names_each_types_paths_by_row_count():
    from verifier_service.x8_pick import describe

    assert describe({"Q4_K": {1: "avx2", 2: "avx2", 4: "avx512vnni", 8: "avx512vnni"},
                     "Q6_K": {1: "avx512vnni", 2: "avx512vnni"}}) == "Q4_K: avx2 at 1-2 rows, avx512vnni from 3; Q6_K: avx512vnni"
    assert describe({"Q8_0": {1: "avx2", 2: "avx512", 4: "avx512vnni"}}) == \
        "Q8_0: avx2 at 1 row, avx512 at 2 rows, avx512vnni from 3"
