"""Greedy answers with the teacher's top-k kept on the way (tandem.distill.answers) carry exactly what
a separate teacher pass over the same text gives, and the answers are the target's own greedy ones,
whatever the batch and its left padding."""

from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")


def _greedy(model, prompt, n, eos):
    ids = list(prompt)
    with torch.no_grad():
        for _ in range(n):
            tok = int(model(input_ids=torch.tensor([ids])).logits[0, -1].argmax())
            ids.append(tok)
            if tok in eos:
                break
    return ids[len(prompt):]


def test_answers_match_greedy_decoding_and_a_teacher_pass(tiny_target_dir, tmp_path):
    from tandem.distill import answers, data
    from tandem.models import load_causal_lm

    model, _, _ = load_causal_lm(str(tiny_target_dir))
    rng = np.random.default_rng(1)
    # prompts of different lengths, so batches are left padded; a batch budget that splits them
    prompts = [{"prompt_ids": [1] + rng.integers(3, 64, size=int(n)).tolist(), "category": "c", "source": f"s{i}"}
               for i, n in enumerate(rng.integers(2, 30, size=7))]
    info = answers.answer_prompts(model, prompts, tmp_path / "ans", max_new_tokens=12, topk=4, shard_size=4,
                                  batch_tokens=90, eos_ids=(2,), progress=False)
    assert len(info["shards"]) == 2
    saved = data.load_shards(info["shards"])
    assert len(saved) == 7 and sorted(s["source"] for s in saved) == sorted(p["source"] for p in prompts)

    by_source = {p["source"]: p for p in prompts}
    records = []
    for s in saved:
        prompt = by_source[s["source"]]["prompt_ids"]
        assert s["start"] == len(prompt) and s["tokens"][:len(prompt)].tolist() == prompt
        answer = s["tokens"][len(prompt):].tolist()
        assert answer == _greedy(model, prompt, 12, {2})  # the target's own greedy answer
        assert s["top_ids"].shape == (len(s["tokens"]) - 1, 4) == s["top_logp"].shape
        # the teacher's top-1 after each answer prefix is the next answer token
        assert (s["top_ids"][len(prompt) - 1:, 0][:len(answer)] == np.asarray(answer)).all()
        records.append(data.Record(prompt, answer, source=s["source"]))

    data.teacher_pass(model, records, tmp_path / "teacher.pt", topk=4, progress=False)
    teacher = {t["source"]: t for t in data.load_shards([tmp_path / "teacher.pt"])}
    for s in saved:
        t = teacher[s["source"]]
        assert (t["tokens"] == s["tokens"]).all()
        np.testing.assert_allclose(t["top_logp"].astype(np.float32), s["top_logp"].astype(np.float32), atol=2e-2)
        same = (t["top_ids"] == s["top_ids"]).mean()
        assert same > 0.97  # ties among near-equal log-probs may swap order

    # a rerun keeps the shards already written
    mtimes = [p.stat().st_mtime_ns for p in map(Path, info["shards"])]
    answers.answer_prompts(model, prompts, tmp_path / "ans", max_new_tokens=12, topk=4, shard_size=4,
                           batch_tokens=90, eos_ids=(2,), progress=False)
    assert mtimes == [p.stat().st_mtime_ns for p in map(Path, info["shards"])]


def test_batched_generation_is_the_targets_greedy_decoding(tiny_target_dir):
    """data.generate (left padding, the prefill's head on the last position only) gives each prompt the
    answer that unbatched greedy decoding gives."""
    from tandem.distill import data
    from tandem.models import load_causal_lm

    model, _, _ = load_causal_lm(str(tiny_target_dir))
    rng = np.random.default_rng(4)
    prompts = [[1] + rng.integers(3, 64, size=int(n)).tolist() for n in rng.integers(2, 40, size=6)]
    outs = data.generate(model, prompts, 10, greedy=True, batch_size=4, eos_ids=(2,), progress=False)
    assert outs == [_greedy(model, p, 10, {2}) for p in prompts]
