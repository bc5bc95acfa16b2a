"""A shipped drafter graph back into a training checkpoint (tandem.distill.init_from_onnx): the student it
builds holds the graph's weights, so ``tandem distill --init-from`` continues the drafter users run."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")


def _student(tiny_target_dir, out):
    from tandem.distill import student
    from tandem.models import load_causal_lm

    target, tok, _ = load_causal_lm(str(tiny_target_dir))
    vocab = target.config.vocab_size
    draft_vocab = np.arange(0, vocab, 2, dtype=np.int64)          # a reduced head, as shipped drafters have
    spec = student.StudentSpec(hidden=32, layers=2, heads=2, kv_heads=1, intermediate=48, draft_vocab=len(draft_vocab))
    model = student.build_student(target, tok, spec, draft_vocab, seed=5)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))                    # norms and head not at their initial values
    student.save_student(model, tok, draft_vocab, out)
    return model, draft_vocab


@pytest.mark.parametrize("quantize", [None, "int8"])
def test_the_checkpoint_holds_the_graph_weights(tiny_target_dir, tmp_path, quantize):
    from tandem.distill.init_from_onnx import checkpoint_from_graph, main
    from tandem.export import export_drafter

    model, draft_vocab = _student(tiny_target_dir, tmp_path / "hf")
    export_drafter(tmp_path / "hf", tmp_path / "onnx", quantize=quantize)
    ckpt, dv = checkpoint_from_graph(tmp_path / "onnx", str(tiny_target_dir))
    assert (dv == draft_vocab).all()
    want = model.state_dict()
    tol = 1e-6 if quantize is None else 0.02                      # int8: one quantization step of these weights
    for name, value in ckpt["model"].items():
        if name == "lm_head.weight":
            continue
        torch.testing.assert_close(value, want[name], atol=tol, rtol=0, msg=name)
    torch.testing.assert_close(ckpt["head"], want["lm_head.weight"][torch.from_numpy(draft_vocab)], atol=tol, rtol=0)

    # the command writes what --init-from reads: the checkpoint and the draft vocabulary beside it
    assert main(["--graph", str(tmp_path / "onnx"), "--out", str(tmp_path / "init" / "init.pt"),
                 "--target", str(tiny_target_dir)]) == 0
    assert (np.load(tmp_path / "init" / "draft_vocab.npy") == draft_vocab).all()
    trainer_state = torch.load(tmp_path / "init" / "init.pt", weights_only=False)
    assert trainer_state["head"].shape == (len(draft_vocab), 32)        # what Trainer.load_weights copies
    model.load_state_dict(trainer_state["model"])
