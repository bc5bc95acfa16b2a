"""Teacher data from the served decoder (tandem.distill.served_answers): the greedy answer is the target's
own plain decoding, every row's top-k is what a forward over the finished text gives, and the sampled
answers depend on the seed only, not on how many answers shared a forward."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from tiny_models import tiny_served_gguf  # noqa: E402


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    from verifier_service.target_model import TargetModel

    path = tiny_served_gguf(tmp_path_factory.mktemp("served_answers") / "tiny.gguf")
    model = TargetModel.load(str(path))
    assert model.decoder is not None, model.path
    return path, model


def _prompts(n=5):
    rng = np.random.default_rng(4)
    return [{"prompt_ids": [1] + rng.integers(3, 400, size=int(k)).tolist(), "source": f"s{i}", "category": "c"}
            for i, k in enumerate(rng.integers(3, 40, size=n))]


def _plain_greedy(decoder, prompt, n, eos):
    cache = decoder.new_cache()
    logits = decoder.forward(cache, prompt)[-1]
    out = []
    for _ in range(n):
        out.append(int(logits.argmax()))
        if out[-1] in eos or len(out) == n:
            break
        logits = decoder.forward(cache, [out[-1]])[-1]
    return out


def _run(model, prompts, **kw):
    from tandem.distill.served_answers import generate_answers
    from verifier_service import torch_thread

    got = []
    torch_thread.run(generate_answers, model.decoder, prompts, on_answer=got.append,
                     eos_ids=model.info.eos_token_ids, **kw)
    return {(r["source"], r["sample"]): r for r in got}


def test_greedy_answers_are_plain_decoding_and_rows_carry_the_teacher(served):
    from verifier_service import torch_thread

    _, model = served
    prompts = _prompts()
    got = _run(model, prompts, samples=3, max_new_tokens=12, topk=4, slots=4, seed=7)
    assert len(got) == 15
    eos = set(model.info.eos_token_ids)
    for p in prompts:
        greedy = got[(p["source"], 0)]
        assert greedy["start"] == len(p["prompt_ids"]) and greedy["tokens"][:greedy["start"]].tolist() == p["prompt_ids"]
        answer = greedy["tokens"][greedy["start"]:].tolist()
        assert answer == torch_thread.run(_plain_greedy, model.decoder, p["prompt_ids"], 12, eos)
        for s in range(3):
            r = got[(p["source"], s)]
            assert r["top_ids"].shape == (len(r["tokens"]) - 1, 4) == r["top_logp"].shape
            # a forward over the finished text gives every row's top-k (rows are exact: same bits)
            logits = torch_thread.run(model.decoder.forward, model.decoder.new_cache(), r["tokens"][:-1].tolist())
            v, i = torch.log_softmax(logits.float(), -1).topk(4, -1)
            assert (i.numpy() == r["top_ids"]).mean() > 0.99
            np.testing.assert_allclose(v.numpy(), r["top_logp"].astype(np.float32), atol=1e-2)
    sampled = [got[(p["source"], s)]["tokens"].tolist() for p in prompts for s in (1, 2)]
    greedy = [got[(p["source"], 0)]["tokens"].tolist() for p in prompts]
    assert any(s not in greedy for s in sampled)   # temperature 0.8 over a random model's flat distribution


def test_sampled_answers_depend_on_the_seed_not_on_the_batch(served):
    _, model = served
    prompts = _prompts(4)
    a = _run(model, prompts, samples=3, max_new_tokens=10, topk=2, slots=5, seed=1)
    b = _run(model, prompts, samples=3, max_new_tokens=10, topk=2, slots=2, seed=1)
    c = _run(model, prompts, samples=3, max_new_tokens=10, topk=2, slots=5, seed=2)
    assert a.keys() == b.keys() == c.keys()
    assert all((a[k]["tokens"] == b[k]["tokens"]).all() and (a[k]["top_ids"] == b[k]["top_ids"]).all() for k in a)
    assert any(a[k]["tokens"].tolist() != c[k]["tokens"].tolist() for k in a if k[1] > 0)
    assert all(a[k]["tokens"].tolist() == c[k]["tokens"].tolist() for k in a if k[1] == 0)


def test_the_command_writes_resumable_shards(served, tmp_path):
    import gzip
    import json

    from tandem.distill import answers, data

    path, _ = served
    prompts = tmp_path / "p.jsonl.gz"
    with gzip.open(prompts, "wt") as f:
        for p in _prompts(5):
            f.write(json.dumps(p) + "\n")
    argv = ["--engine", "served", "--target", str(path), "--prompts", str(prompts), "--out-dir", str(tmp_path / "a"),
            "--samples", "2", "--max-new-tokens", "6", "--shard-size", "2", "--threads", "1", "--no-progress"]
    assert answers.main(argv) == 0
    shards = sorted((tmp_path / "a").glob("answers_*.pt"))
    assert len(shards) == 3
    assert len(data.load_shards(shards)) == 10
    first = shards[0].stat().st_mtime_ns
    assert answers.main(argv) == 0
    assert shards[0].stat().st_mtime_ns == first   # kept, not rewritten


def test_served_references_are_the_targets_greedy_answers_to_held_out_questions(served, tmp_path):
    import json

    from tandem.distill import data, evaluate
    from verifier_service import torch_thread

    path, model = served
    out = tmp_path / "refs.jsonl"
    n = evaluate.make_refs_served(str(path), out, per_category=1, max_new=6)
    refs = [json.loads(line) for line in out.read_text().splitlines()]
    # one question a category; those longer than the tiny target's context (512) are left out
    assert n == len(refs) == len({r["category"] for r in refs}) >= 8
    assert not any(data.is_training_question(r["question_id"]) for r in refs)  # held out only
    eos = set(model.info.eos_token_ids)
    for r in refs[:4]:
        assert r["greedy_ids"] == torch_thread.run(_plain_greedy, model.decoder, r["prompt_ids"], 6, eos)


def test_prompts_past_the_context_are_left_out_and_answers_end_at_it(served):
    from tandem.distill.served_answers import generate_answers
    from verifier_service import torch_thread

    _, model = served
    context = model.decoder.max_length
    prompts = [{"prompt_ids": [1] + [5] * (context + 3), "source": "long"},
               {"prompt_ids": [1] + [7] * (context - 6), "source": "near"},
               {"prompt_ids": [1, 9, 10], "source": "short"}]
    got = []
    info = torch_thread.run(generate_answers, model.decoder, prompts, max_new_tokens=40, topk=2, eos_ids=(),
                            on_answer=got.append)
    assert info["skipped_prompts"] == 1 and sorted(r["source"] for r in got) == ["near", "short"]
    near = next(r for r in got if r["source"] == "near")
    assert len(near["tokens"]) <= context and near["top_ids"].shape[0] == len(near["tokens"]) - 1
