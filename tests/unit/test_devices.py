"""Where the distillation tools run: `--device auto` takes a CUDA GPU when torch sees one and the CPU
otherwise; a GPU asked for on a machine without one is a clear error (exit 2), not a crash inside
torch. The tests marked `needs_cuda` compare GPU runs with CPU runs and are skipped without a GPU."""

import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")

HAS_CUDA = torch.cuda.is_available()
needs_cuda = pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")
needs_no_cuda = pytest.mark.skipif(HAS_CUDA, reason="checks the message given on a machine without a GPU")


def test_auto_is_the_gpu_when_there_is_one_else_the_cpu():
    from tandem.models import resolve_device

    assert resolve_device("auto") == ("cuda" if HAS_CUDA else "cpu")
    assert resolve_device(None) == resolve_device("auto")
    assert resolve_device("cpu") == "cpu"
    with pytest.raises(ValueError, match="not a torch device name"):
        resolve_device("gpu0")


@needs_no_cuda
def test_asking_for_a_gpu_without_one_says_so():
    from tandem.models import resolve_device

    with pytest.raises(ValueError, match="sees no CUDA GPU"):
        resolve_device("cuda:0")


@needs_no_cuda
def test_the_tools_exit_2_when_the_gpu_is_missing(tiny_target_dir, tmp_path, capsys):
    import argparse

    from tandem.distill import answers, cli

    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"prompt_ids": [1, 5, 6]}) + "\n")
    assert answers.main(["--prompts", str(prompts), "--out-dir", str(tmp_path / "a"), "--target",
                         str(tiny_target_dir), "--device", "cuda", "--no-progress"]) == 2
    assert "sees no CUDA GPU" in capsys.readouterr().err
    parser = cli.configure(argparse.ArgumentParser())
    args = parser.parse_args(["--target", str(tiny_target_dir), "--out", str(tmp_path / "d"), "--device", "cuda",
                              "--work-dir", str(tmp_path / "w"),
                              "--generate", "2", "--prompts", str(prompts), "--no-progress"])
    assert cli.run(args) == 2
    assert "sees no CUDA GPU" in capsys.readouterr().err
    assert not (tmp_path / "d").exists()
    from tandem.distill import evaluate

    assert evaluate.main(["refs", "--target", str(tiny_target_dir), "--out", str(tmp_path / "refs.jsonl"),
                          "--device", "cuda"]) == 2
    assert "sees no CUDA GPU" in capsys.readouterr().err


@needs_cuda
def test_answers_on_the_gpu_equal_answers_on_the_cpu(tiny_target_dir, tmp_path):
    from tandem.distill import answers, data
    from tandem.models import load_causal_lm

    rng = np.random.default_rng(3)
    prompts = [{"prompt_ids": [1] + rng.integers(3, 64, size=int(n)).tolist(), "source": f"s{i}"}
               for i, n in enumerate(rng.integers(2, 30, size=9))]
    runs = {}
    for dev in ("cpu", "cuda"):
        model, _, _ = load_causal_lm(str(tiny_target_dir), device=dev)
        info = answers.answer_prompts(model, prompts, tmp_path / dev, max_new_tokens=12, topk=4, shard_size=5,
                                      batch_tokens=120, eos_ids=(2,), progress=False)
        runs[dev] = {s["source"]: s for s in data.load_shards(info["shards"])}
    for src, c in runs["cpu"].items():
        g = runs["cuda"][src]
        assert c["tokens"].tolist() == g["tokens"].tolist()
        assert (c["top_ids"][:, 0] == g["top_ids"][:, 0]).mean() > 0.99
        np.testing.assert_allclose(c["top_logp"][:, 0].astype(np.float32), g["top_logp"][:, 0].astype(np.float32),
                                   atol=2e-2)


@needs_cuda
def test_distill_trains_on_the_gpu(tiny_target_dir, tmp_path):
    import argparse

    from tandem.distill import cli

    prompts = tmp_path / "prompts.jsonl"
    rng = np.random.default_rng(0)
    prompts.write_text("".join(json.dumps({"prompt_ids": [1] + rng.integers(3, 64, size=8).tolist()}) + "\n"
                               for _ in range(6)))
    out = tmp_path / "drafter"
    parser = cli.configure(argparse.ArgumentParser())
    argv = ["--target", str(tiny_target_dir), "--out", str(out), "--work-dir", str(tmp_path / "work"),
            "--generate", "12", "--gen-tokens", "24", "--prompts", str(prompts), "--hidden", "16", "--layers", "1",
            "--heads", "2", "--kv-heads", "1", "--intermediate", "32", "--draft-vocab", "48", "--steps", "6",
            "--eval-every", "3", "--ckpt-every", "3", "--no-progress", "--device", "cuda"]
    assert cli.run(parser.parse_args(argv)) == 0
    info = json.loads((out / "distill_info.json").read_text())
    assert info["device"].startswith("cuda") and info["train"]["step"] == 6
    # resume reads the GPU checkpoint back
    assert cli.run(parser.parse_args([a if a != "6" else "8" for a in argv] + ["--resume"])) == 0
    assert json.loads((out / "distill_info.json").read_text())["train"]["step"] == 8
