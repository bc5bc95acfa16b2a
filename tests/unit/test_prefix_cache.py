"""A prompt that begins with an ended session's tokens (a chat's next turn) takes their K/V from the prefix cache
and prefills only the rest, and its tokens, logits and K/V are those of a prefill from scratch: through a real
Target on a tiny GGUF file with int8 activations on the x8 kernels (where the cache is on), greedy and seeded.
Off on a path whose prompt rows depend on their chunks (fp32 activations in wide chunks on torch's GEMM)."""

from __future__ import annotations

import pytest
import torch

from tandem.bench.random_gguf import write
from tandem.types import DraftToken, SamplingParams
from tiny_models import make_tokenizer
from verifier_service import native
from verifier_service.gguf_model import GgufModel
from verifier_service.prefix_cache import MIN_PREFIX, PrefixCache
from verifier_service.target import Target


# ---- the cache alone ----------------------------------------------------------------------------------------
def kv(positions: int) -> torch.Tensor:
    return torch.zeros(2, 2, 1, positions, 4)            # 64 bytes a position


def test_the_longest_common_prefix_wins_and_the_last_prompt_token_is_left_to_prefill():
    cache = PrefixCache(1 << 20)
    a, b = list(range(40)), list(range(20)) + [99] * 20
    cache.put(a, kv(40))
    cache.put(b, kv(40))
    hit = cache.match(list(range(30)) + [7])
    assert hit.length == 30 and hit.kv is not None
    assert cache.match(a).length == 39                    # the whole prompt cached: its last row still runs
    assert cache.match(list(range(MIN_PREFIX - 1)) + [500] * 10) is None
    assert cache.hits == 2 and cache.reused_tokens == 69


def test_a_salt_keeps_prefixes_among_its_own_requests():
    cache = PrefixCache(1 << 20)
    cache.put(list(range(40)), kv(40), salt="alice")
    assert cache.match(list(range(41))) is None and cache.match(list(range(41)), salt="bob") is None
    assert cache.match(list(range(41)), salt="alice").length == 40
    cache.put(list(range(50)), kv(50), salt="bob")         # extends alice's tokens, but not her entry
    assert len(cache) == 2


def test_a_longer_turn_replaces_the_entry_it_extends_and_the_budget_drops_the_least_recently_used():
    cache = PrefixCache(3 * 64 * 40)                       # three entries of 40 positions
    cache.put(list(range(20)), kv(40))
    cache.put(list(range(30)), kv(40))                     # extends the first: it goes
    assert len(cache) == 1
    cache.put([1000 + i for i in range(20)], kv(40))
    cache.put([2000 + i for i in range(20)], kv(40))
    assert cache.match(list(range(25)) + [5]) is not None  # used: now the most recent
    cache.put([3000 + i for i in range(20)], kv(40))       # over budget: the 1000s go
    assert len(cache) == 3 and cache.nbytes <= cache.max_bytes
    assert cache.match([1000 + i for i in range(20)] + [1]) is None
    assert cache.match(list(range(25)) + [5]).length == 25
    cache.put(list(range(MIN_PREFIX - 1)), kv(40))        # too short to keep
    assert len(cache) == 3


# ---- a real target ------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def int8_file(tmp_path_factory):
    if native.library() is None or native.isa() not in native.X8_ISAS:
        pytest.skip("no x8 int8 kernels on this path")
    return write(tmp_path_factory.mktemp("prefix") / "q4_1.gguf", arch="llama", std=0.3,
                 kinds={"default": "Q4_1"}, seed=5)


def int8_target(path, monkeypatch, **kw) -> Target:
    monkeypatch.setenv("TANDEM_ACTIVATIONS", "int8")
    return Target(GgufModel(path), make_tokenizer(260), path.stem, widths=(1, 2), warmup=False, prefill_chunk=-1,
                  **kw)


def decode(target, sid, prompt, n, sampling, drafts=()) -> list[int]:
    """``n`` tokens of a session; the rounds of ``drafts`` send blocks (each the given ids) instead of plain steps,
    so the cache holds rows of verify blocks as well."""
    out = [target.start(sid, prompt, sampling)[0]]
    drafts = list(drafts)
    while len(out) < n:
        block = drafts.pop(0) if drafts else []
        outcome = target.verify(sid, [DraftToken(t, from_lookup=True) for t in block])
        out += block[:outcome.accepted] + [outcome.next_token]
    return out[:n]


@pytest.mark.parametrize("sampling", [SamplingParams(), SamplingParams(temperature=0.9, seed=1234)],
                         ids=["greedy", "seeded"])
def test_a_next_turn_reuses_the_conversation_and_gets_the_tokens_of_a_fresh_prefill(int8_file, monkeypatch,
                                                                                     sampling):
    torch.manual_seed(0)
    cached = int8_target(int8_file, monkeypatch)
    fresh = int8_target(int8_file, monkeypatch, prefix_cache_mb=0)
    assert cached.caches_prefixes and cached.prefix_cache is not None and fresh.prefix_cache is None
    assert "prefix cache of 256 MiB" in cached.startup_line()

    turn1 = [(5 * i + 1) % 260 for i in range(37)]
    answer = decode(cached, "t1", turn1, 20, sampling, drafts=[[3, 4, 5], [], [9, 9]])
    cached.end("t1")
    assert len(cached.prefix_cache) == 1
    # what the cache holds: the prompt and every emitted token but the last (not yet fed)
    assert cached.prefix_cache._entries[0].tokens.tolist() == turn1 + answer[:-1]

    turn2 = turn1 + answer + [(3 * i + 7) % 260 for i in range(11)]
    got = decode(cached, "t2", turn2, 12, sampling, drafts=[[1, 2]])
    assert cached.prefix_cache.hits == 1 and cached.prefix_cache.reused_tokens == len(turn1) + len(answer) - 1
    want = decode(fresh, "t2", turn2, 12, sampling, drafts=[[1, 2]])
    assert got == want
    a, b = cached.sessions.require("t2").cache, fresh.sessions.require("t2").cache
    assert a.length == b.length and torch.equal(a.kv[:, :, :, :a.length], b.kv[:, :, :, :b.length])

    # a prompt sharing only its beginning (a rephrased question after the same system prompt)
    cached.end("t2")
    other = turn1[:25] + [200] * 9
    assert decode(cached, "t3", other, 6, sampling) == decode(fresh, "t3", other, 6, sampling)
    assert cached.prefix_cache.hits == 2


def test_no_prefix_cache_where_a_prompts_rows_depend_on_its_chunks(int8_file, monkeypatch):
    monkeypatch.setenv("TANDEM_ACTIVATIONS", "fp32")
    fp32 = Target(GgufModel(int8_file), make_tokenizer(260), "fp32", widths=(1,), warmup=False, prefill_chunk=-1)
    assert not fp32.caches_prefixes and fp32.prefix_cache is None
    assert "no prefix cache (prompt chunks of 256 rows do not run the row-exact kernels" in fp32.startup_line()
