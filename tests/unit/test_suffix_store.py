"""The suffix index on disk (drafter_service/suffix_store.py): what a drafter learned comes back after a
restart in its least-recently-used order, seeds start it with its target's habits, and a bad file is refused
whole, with its line."""

import gzip
import json
import os
import stat

import pytest

from drafter_service import suffix_store
from drafter_service.factory import SEED_FILE, load_drafter, suffix_index_files
from drafter_service.suffix import SuffixIndex


def test_saved_sequences_come_back_in_their_order_and_propose_the_same(tmp_path):
    index = SuffixIndex()
    for seq in ([1, 2, 3, 4, 5, 6], [7, 8, 9, 10], [1, 2, 3, 40, 41]):
        index.add(seq)
    index.propose([0, 7, 8], 2)                         # used: moves to the most recent end
    path = tmp_path / "store" / "suffix.jsonl.gz"
    assert suffix_store.save(index, path) == 15
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600           # it holds the sessions' text
    again = SuffixIndex()
    assert suffix_store.load(again, path) == 15
    assert again.released() == index.released()
    for context in ([9, 1, 2, 3], [0, 7, 8], [5, 6]):
        assert again.propose(context, 4) == index.propose(context, 4)
    # a budget smaller than the file keeps the most recently used, as the running drafter would have
    small = SuffixIndex(max_tokens=9)
    suffix_store.load(small, path)
    assert small.released() == index.released()[-2:]


def test_open_sessions_are_not_saved(tmp_path):
    index = SuffixIndex()
    live = index.open()
    index.extend(live, [1, 2, 3])
    index.add([4, 5, 6])
    suffix_store.save(index, tmp_path / "s.gz")
    assert suffix_store.read_sequences(tmp_path / "s.gz") == [[4, 5, 6]]


def test_distillation_records_seed_their_outputs_only(tmp_path):
    corpus = tmp_path / "answers.jsonl"                 # plain JSON lines, the distillation format
    corpus.write_text(json.dumps({"question_id": 4, "prompt_ids": [90, 91], "output_ids": [5, 6, 7]}) + "\n\n")
    assert suffix_store.read_sequences(corpus) == [[5, 6, 7]]


@pytest.mark.parametrize("line, why", [
    ("not json", "not JSON"),
    ('{"prompt_ids": [1]}', "'tokens'"),
    ('{"tokens": [1, "2"]}', "int32"),
    ('{"tokens": [1, 4294967296]}', "int32"),
    ('[1, 2]', "'tokens'"),
])
def test_a_bad_line_refuses_the_file_naming_the_line(tmp_path, line, why):
    path = tmp_path / "bad.jsonl.gz"
    with gzip.open(path, "wt") as f:
        f.write('{"tokens": [1, 2, 3]}\n' + line + "\n")
    index = SuffixIndex()
    with pytest.raises(suffix_store.SuffixFileError, match=f"line 2 .*: .*{why}"):
        suffix_store.load(index, path)
    assert index.tokens == 0                            # nothing of the file kept


def test_a_missing_or_truncated_file_is_refused(tmp_path):
    with pytest.raises(suffix_store.SuffixFileError, match="does not exist"):
        suffix_store.read_sequences(tmp_path / "none.gz")
    whole = tmp_path / "whole.gz"
    index = SuffixIndex()
    index.add(list(range(5000)))
    suffix_store.save(index, whole)
    cut = tmp_path / "cut.gz"
    cut.write_bytes(whole.read_bytes()[:200])
    with pytest.raises(suffix_store.SuffixFileError, match="cannot be read"):
        suffix_store.read_sequences(cut)


def test_the_drafter_reads_its_directorys_seed_then_the_store(tmp_path, tiny_drafter_onnx):
    seeded = tmp_path / "drafter"
    seeded.mkdir()
    for f in tiny_drafter_onnx.iterdir():
        (seeded / f.name).symlink_to(f)
    seed = SuffixIndex()
    seed.add([50, 51, 52, 53, 54])
    suffix_store.save(seed, seeded / SEED_FILE)
    store = tmp_path / "learned.gz"
    assert suffix_index_files(seeded, "auto", store, "global") == [seeded / SEED_FILE]     # no store yet
    d = load_drafter(seeded, threads=1, suffix=True, suffix_store=store)
    assert d.index.tokens == 5
    assert [t.origin for t in d.propose("a", 0, [9, 50, 51, 52], 2).tokens] == ["suffix", "suffix"]
    learned = SuffixIndex()
    learned.add([60, 61, 62])
    suffix_store.save(learned, store)
    # once a store exists it is read instead of the seeds: it holds what was kept of them (no text twice)
    assert suffix_index_files(seeded, "auto", store, "global") == [store]
    assert load_drafter(seeded, threads=1, suffix=True, suffix_store=store).index.tokens == 3
    assert suffix_index_files(seeded, "none", None, "global") == []
    assert load_drafter(seeded, threads=1, suffix=True, suffix_seed="none").index.tokens == 0
    assert load_drafter("suffix", suffix_seed=str(store)).index.tokens == 3
    with pytest.raises(ValueError, match="need --suffix-scope global"):
        load_drafter("suffix", suffix_scope="session", suffix_store=store)
