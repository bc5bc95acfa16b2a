"""A GGUF target for the decoder: its ``DecoderSpec``, its weights in the decoder's layout, its tokenizer.

``GgufModel(path)`` reads the header (``gguf_file``; no weights yet) and the architecture
(``architecture.from_gguf``; ``unsupported`` holds why not, when the decoder cannot run it).
``load_weights()`` builds ``DecoderWeights`` tensor by tensor from the file's map: block
types with a kernel here become ``weights.BlockWeight``s (the file's blocks), the others their
dequantized values (``weights.DenseWeight``, a copy whose source pages are then dropped from the
process: ``GgufFile.release``); norms are small F32 vectors. Block weights stay in the map, so the
resident set is the file's pages the forward touches (about the file's size) plus the KV caches.

Rope layout: llama.cpp stores a Llama model's q/k rows for rope on adjacent pairs; the decoder applies
rope in the layout the file has (``DecoderSpec.rope_layout``), so q/k rows are used as stored.

The tokenizer is transformers' conversion of the file's vocabulary (``AutoTokenizer.from_pretrained(dir,
gguf_file=name)``, what ``tandem.models`` loads for a GGUF target: the same vocabulary hash). It reads the
whole header with gguf-py (39 s and 700 MB for a 262 k vocabulary), so it runs once per file in a child
process and is kept under ``$XDG_CACHE_HOME/tandem/tokenizers`` with what the verifier needs of it
(``tokenizer_info()``: the verifier itself holds no tokenizer object, 300 MB for a 262 k vocabulary;
``tokenizer()`` loads one for benches and checks).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from verifier_service import weights as W
from verifier_service.architecture import DecoderSpec, UnsupportedModel, from_gguf
from verifier_service.decoder import Decoder, DecoderWeights, LayerWeights
from verifier_service.gguf_file import GgufFile
from verifier_service.info import TokenizerInfo
from verifier_service.ops import backend

# Chat templates for files whose metadata has none (the model family's published format).
FALLBACK_CHAT_TEMPLATES = {
    "gemma3": ("{{ bos_token }}{% for message in messages %}{% if message['role'] == 'assistant' %}"
               "{% set role = 'model' %}{% else %}{% set role = message['role'] %}{% endif %}"
               "<start_of_turn>{{ role }}\n{{ message['content'] | trim }}<end_of_turn>\n{% endfor %}"
               "{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}"),
}
INFO_FILE = "tandem_tokenizer.json"      # beside the converted tokenizer: what the verifier needs of it
WIRE_FILE = "tokenizer.wire.json"        # the tokenizer JSON as the verifier sends it to a gateway
SOURCE_FILE = "source.json"              # the GGUF file (path, size, mtime) a cached conversion was made from
# Tokens that end a turn besides the file's EOS, by family (llama.cpp treats them as end of generation).
END_OF_TURN_TOKENS = {"gemma3": ("<end_of_turn>",)}


class GgufModel:
    def __init__(self, path: str | os.PathLike):
        t0 = time.perf_counter()
        self.path = Path(path)
        self.file = GgufFile(self.path)
        self.architecture = str(self.file.get("general.architecture", "?"))
        self.spec: DecoderSpec | None = None
        self.unsupported = ""
        self.activations_note = ""      # why --activations auto chose what it did (activation_choice.settle)
        try:
            self.spec = from_gguf(self.file)
        except UnsupportedModel as e:
            self.unsupported = str(e)
        self.read_s = time.perf_counter() - t0

    @property
    def size(self) -> int:
        return self.file.size

    def kinds(self) -> list[str]:
        """Block types of the 2-D tensors, most bytes first."""
        by = self.file.matrix_bytes()
        return sorted(by, key=by.get, reverse=True)

    # ---- weights -----------------------------------------------------------------------------------
    def _weight(self, name: str, gemm: bool = True) -> W.Weight:
        """``gemm``: False for a weight only looked up by rows (an untied embedding)."""
        info = self.file.tensors[name]
        if len(info.shape) != 2:
            raise UnsupportedModel(f"{name} has shape {info.shape}, expected a matrix")
        out, inner = info.shape
        weight = W.from_gguf(info.kind, self.file.raw(name), out, inner, gemm)
        if not isinstance(weight, W.BlockWeight) or weight.blocks.copied:
            self.file.release(name)             # copied: the map's pages need not stay resident (the x8 copy of
                                                # int8 blocks, the fp32-scale copy of fp32 ones; rows() reads those)
        return weight

    def _vector(self, name: str) -> torch.Tensor:
        return torch.from_numpy(self.file.vector(name)).contiguous()

    def _has(self, name: str) -> bool:
        return name in self.file.tensors

    def load_weights(self) -> DecoderWeights:
        """The decoder's weights (see the module docstring)."""
        s = self.spec
        if s is None:
            raise UnsupportedModel(self.unsupported)
        tied = not self._has("output.weight")
        embed = self._weight("token_embd.weight", gemm=tied)        # untied: only rows are looked up
        head = embed if tied else self._weight("output.weight")
        layers = []
        for i in range(s.layers):
            p = f"blk.{i}."
            missing = [n for n in ("attn_norm", "attn_q", "attn_k", "attn_v", "attn_output", "ffn_norm", "ffn_gate",
                                   "ffn_up", "ffn_down") if not self._has(f"{p}{n}.weight")]
            if missing:
                raise UnsupportedModel(f"layer {i} has no {', '.join(missing)} (not a gated-MLP decoder layer)")
            layer = LayerWeights(
                attn_norm=self._vector(p + "attn_norm.weight"),
                qkv=W.concat([self._weight(p + "attn_q.weight"), self._weight(p + "attn_k.weight"),
                              self._weight(p + "attn_v.weight")]),
                o=self._weight(p + "attn_output.weight"),
                ffn_norm=self._vector(p + "ffn_norm.weight"),
                gate_up=W.concat([self._weight(p + "ffn_gate.weight"), self._weight(p + "ffn_up.weight")]),
                down=self._weight(p + "ffn_down.weight"))
            if s.qkv_bias:
                layer.qkv_bias = torch.cat([self._vector(p + n) for n in ("attn_q.bias", "attn_k.bias", "attn_v.bias")])
            if s.qk_norm:
                layer.q_norm = self._vector(p + "attn_q_norm.weight")
                layer.k_norm = self._vector(p + "attn_k_norm.weight")
            if s.sandwich_norms:
                layer.post_attn_norm = self._vector(p + "post_attention_norm.weight")
                layer.post_ffn_norm = self._vector(p + "post_ffw_norm.weight")
            layers.append(layer)
        return DecoderWeights(embed, layers, self._vector("output_norm.weight"), head)

    def decoder(self, *, exact_rows: bool = True, gemm: str = "auto", widths=range(1, 10),
                native_ops: bool = True) -> Decoder:
        """The decoder over this file's weights: C kernels where they build here (``native_ops``), else torch
        ops. ``gemm``: the kernels of weights kept dense (``Decoder``)."""
        if self.spec is None:
            raise UnsupportedModel(self.unsupported)
        return Decoder(self.spec, self.load_weights(), backend(native_ops), exact_rows=exact_rows, gemm=gemm,
                       widths=widths, activations_note=self.activations_note)

    # ---- tokenizer and special tokens ----------------------------------------------------------------
    def tokenizer(self):
        """transformers' tokenizer of the file (converted once in a child process, then cached)."""
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(tokenizer_dir(self.path))

    def tokenizer_info(self) -> TokenizerInfo:
        """What the verifier needs of the tokenizer, from the cached conversion (no tokenizer object)."""
        return converted_tokenizer_info(self.path)

    def describe(self) -> str:
        return f"{self.architecture}, {'/'.join(self.kinds())} blocks, {self.size / 1e6:.0f} MB mapped"


def converted_tokenizer_info(path: str | os.PathLike) -> TokenizerInfo:
    """What a verifier needs of a GGUF file's tokenizer, from its cached conversion (``tokenizer_dir``), without
    opening the model or building a tokenizer object."""
    folder = tokenizer_dir(path)
    meta = json.loads((folder / INFO_FILE).read_text())
    # kept open, read when asked: if a later conversion prunes this entry (its GGUF file replaced while this
    # process serves the old one: prune_tokenizer_cache), the open file still reads
    wire = open(folder / WIRE_FILE, "rb")  # noqa: SIM115 - lives as long as the TokenizerInfo
    size = os.fstat(wire.fileno()).st_size
    return TokenizerInfo(meta["vocab_hash"], meta["chat_template"], meta["bos_token"], meta["eos_token"],
                         tuple(meta["eos_token_ids"]), lambda: _read_whole(wire, size).decode("ascii"))


def _read_whole(f, size: int) -> bytes:
    """The first ``size`` bytes of the open file ``f``, whoever else reads it (``os.pread``: no shared offset)."""
    parts, at = [], 0
    while at < size:
        part = os.pread(f.fileno(), size - at, at)
        if not part:
            raise OSError(f"{f.name}: {size} bytes expected, {at} read")
        parts.append(part)
        at += len(part)
    return b"".join(parts)


def _cache_root() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "tandem" / "tokenizers"


def tokenizer_dir(path: str | os.PathLike) -> Path:
    """A directory holding the GGUF file's tokenizer as transformers converts it (made on first use, in a
    child process so that the conversion's memory is not this process's; keyed by the file's name, size
    and modification time)."""
    path = Path(path).resolve()
    st = path.stat()
    key = hashlib.sha256(f"{path}|{st.st_size}|{st.st_mtime_ns}".encode()).hexdigest()[:16]
    out = _cache_root() / f"{path.stem}-{key}"
    if (out / INFO_FILE).exists():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    prune_tokenizer_cache(out.parent)
    with tempfile.TemporaryDirectory(dir=out.parent) as tmp:
        cmd = [sys.executable, "-m", "verifier_service.gguf_model", str(path), tmp]
        env = {**os.environ, "HF_HUB_OFFLINE": "1"}
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
        if proc.returncode != 0:
            raise RuntimeError(f"converting the tokenizer of {path.name} failed: {proc.stderr.strip()[-600:]}")
        (Path(tmp) / SOURCE_FILE).write_text(json.dumps({"path": str(path), "size": st.st_size,
                                                          "mtime_ns": st.st_mtime_ns}))
        try:
            os.replace(tmp, out)
        except OSError:           # another process made it first
            if not (out / INFO_FILE).exists():
                raise
        os.makedirs(tmp, exist_ok=True)           # TemporaryDirectory's cleanup expects it
    return out


def prune_tokenizer_cache(root: Path) -> list[Path]:
    """Removes the cached conversions whose GGUF file is gone or has changed (its recorded size or modification
    time differ), and returns them: their key can never be asked for again, and a 262 k vocabulary's takes
    ~50 MB. Run before each new conversion (a file moved, replaced or deleted is what makes one). Entries
    without a record (made before records were kept) stay."""
    removed = []
    for entry in root.glob("*-*"):
        try:
            source = json.loads((entry / SOURCE_FILE).read_text())
            recorded = (source["path"], source["size"], source["mtime_ns"])
        except (OSError, ValueError, KeyError, TypeError):
            continue                  # no record (an older entry, or one being made): kept
        try:
            st = os.stat(recorded[0])
            if (st.st_size, st.st_mtime_ns) == recorded[1:]:
                continue
        except FileNotFoundError:
            pass
        except OSError:
            continue                  # cannot tell now (permissions): kept
        shutil.rmtree(entry, ignore_errors=True)
        removed.append(entry)
    return removed


def eos_token_ids(file: GgufFile, tokenizer) -> tuple[int, ...]:
    """The file's EOS and end-of-turn tokens (llama.cpp's end-of-generation set), else the tokenizer's EOS."""
    arch = str(file.get("general.architecture", ""))
    ids = {file.get("tokenizer.ggml.eos_token_id"), file.get("tokenizer.ggml.eot_token_id")}
    vocab = tokenizer.get_vocab()
    ids |= {vocab.get(t) for t in END_OF_TURN_TOKENS.get(arch, ())}
    if not ids - {None} and tokenizer.eos_token_id is not None:
        ids.add(tokenizer.eos_token_id)
    return tuple(sorted(int(i) for i in ids if i is not None))


def _convert_tokenizer(path: str, out: str) -> None:
    """The child process's work: the tokenizer as transformers converts it (with the family's chat template
    where the file has none), saved, and what the verifier needs of it (``INFO_FILE``)."""
    from transformers import AutoTokenizer

    p = Path(path)
    file = GgufFile(p)
    tok = AutoTokenizer.from_pretrained(p.parent, gguf_file=p.name)
    arch = str(file.get("general.architecture", ""))
    if not tok.chat_template and arch in FALLBACK_CHAT_TEMPLATES:
        tok.chat_template = FALLBACK_CHAT_TEMPLATES[arch]
    tok.save_pretrained(out)
    info = TokenizerInfo.of(tok, eos_token_ids(file, tok))
    # compact and ASCII-only (\u escapes): read back as a 1-byte-per-character string (262 k tokens: 12 MB)
    (Path(out) / WIRE_FILE).write_text(json.dumps(json.loads(info.json()), ensure_ascii=True,
                                                  separators=(",", ":")))
    (Path(out) / INFO_FILE).write_text(json.dumps({
        "vocab_hash": info.vocab_hash, "chat_template": info.chat_template, "bos_token": info.bos_token,
        "eos_token": info.eos_token, "eos_token_ids": list(info.eos_token_ids)}))


if __name__ == "__main__":      # the child process of tokenizer_dir
    _convert_tokenizer(sys.argv[1], sys.argv[2])
