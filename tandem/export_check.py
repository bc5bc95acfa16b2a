"""Exported drafter graphs run in ONNX Runtime, and how close they are: to the torch model they came
from (``parity_check``) and to each other (``parity``: the shared-buffer graph against the classic one).

``ClassicRunner`` and ``SharedKVRunner`` feed tokens to the two layouts (``tandem.export``'s
decoder-with-past graph and ``tandem.export_shared_kv``'s), one sequence each, and return the logits
of the last rows fed; they also serve the drafter step benchmark (``tandem.bench.drafter_step``).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

PARITY_TOLERANCE = 1e-3                # fp32 graphs: max |logit| difference enforced


def session(onnx_path, threads: int = 0, profile_prefix: str | None = None):
    """An ONNX Runtime CPU session of ``onnx_path`` (``threads`` 0: ONNX Runtime's default count)."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    opts.log_severity_level = 3
    if profile_prefix:
        opts.enable_profiling = True
        opts.profile_file_prefix = profile_prefix
    return ort.InferenceSession(str(onnx_path), opts, providers=["CPUExecutionProvider"])


class SharedKVRunner:
    """Feeds tokens to a shared-buffer graph through the drafter service's own KV buffers
    (drafter_service.kv_buffers). ``profile_prefix``: ORT profiling on."""

    def __init__(self, onnx_path, threads: int = 1, profile_prefix: str | None = None):
        from drafter_service.kv_buffers import SharedKV, SharedKVGraph

        self.session = session(onnx_path, threads, profile_prefix)
        past = [i for i in self.session.get_inputs() if i.name.startswith("past_key_values.")]
        _, kv, _, dim = past[0].shape
        logits = {o.name: o for o in self.session.get_outputs()}["logits"].shape[-1]
        positions = int(self.session.get_modelmeta().custom_metadata_map["max_positions"])
        self.kv = SharedKV(SharedKVGraph(self.session, tuple(p.name for p in past), kv, dim, np.float32, logits,
                                         positions))

    @property
    def length(self) -> int:
        return self.kv.length

    def crop(self, length: int) -> None:
        """Keeps the first ``length`` tokens (a rollback: the buffers are not touched)."""
        self.kv.crop(length)

    def feed(self, ids: list[int], rows: int = 1) -> np.ndarray:
        """Logits [rows, vocab] of the last ``rows`` of ``ids``, fed after what the buffers hold."""
        return self.kv.run(ids, rows)[0].copy()


class ClassicRunner:
    """Feeds tokens to a classic decoder-with-past graph (present = concat(past, new))."""

    def __init__(self, onnx_path, threads: int = 1, profile_prefix: str | None = None):
        self.session = session(onnx_path, threads, profile_prefix)
        past = [i for i in self.session.get_inputs() if i.name.startswith("past_key_values.")]
        self.names = [p.name for p in past]
        _, kv, _, dim = past[0].shape
        self.past = [np.zeros((1, kv, 0, dim), np.float32) for _ in past]

    @property
    def length(self) -> int:
        return self.past[0].shape[2]

    def feed(self, ids: list[int], rows: int = 1) -> np.ndarray:
        p, n = self.length, len(ids)
        feed = {"input_ids": np.asarray([ids], np.int64), "attention_mask": np.ones((1, p + n), np.int64),
                "position_ids": np.arange(p, p + n, dtype=np.int64)[None]}
        feed.update(zip(self.names, self.past))
        out = self.session.run(None, feed)
        self.past = out[1:]
        return out[0][0, -rows:]


def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x.astype(np.float64) - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def _compare(a: np.ndarray, b: np.ndarray, acc: dict) -> None:
    acc["max_abs_logit_diff"] = max(acc.get("max_abs_logit_diff", 0.0), float(np.abs(a - b).max()))
    acc["max_abs_q_diff"] = max(acc.get("max_abs_q_diff", 0.0), float(np.abs(_softmax(a) - _softmax(b)).max()))
    acc["positions"] = acc.get("positions", 0) + a.shape[0]
    acc["top1_equal"] = acc.get("top1_equal", 0) + int((a.argmax(-1) == b.argmax(-1)).sum())
    acc["identical_rows"] = acc.get("identical_rows", 0) + int((a == b).all(-1).sum())


def parity(classic_onnx, shared_onnx, prompts: list[list[int]], steps: int = 32,
           draft_vocab: np.ndarray | None = None, chunk: int = 64) -> dict:
    """The two graphs fed the same tokens: each prompt in one run (logits of every position, and of the last
    one alone), then ``steps`` greedy tokens of the classic graph one at a time. Per phase: max |logit| and
    |q| differences (q: softmax at temperature 1), top-1 agreement, rows bit-identical. For scale,
    ``classic_chunked`` is the classic graph against itself with the prompt fed in runs of ``chunk`` tokens
    (int8 activations are quantized per run, so the classic graph's own logits depend on how the tokens were
    batched)."""
    phases = ("prompt", "prompt_last_row", "greedy_steps", "classic_chunked")
    out: dict = {"prompts": len(prompts), "steps": steps, **{p: {} for p in phases}}
    for ids in prompts:
        old, new = ClassicRunner(classic_onnx), SharedKVRunner(shared_onnx)
        a = old.feed(ids, len(ids))
        _compare(a, SharedKVRunner(shared_onnx).feed(ids, len(ids)), out["prompt"])
        _compare(a[-1:], new.feed(ids, 1), out["prompt_last_row"])      # the head on the returned row only
        chunked = ClassicRunner(classic_onnx)
        runs = [ids[i:i + chunk] for i in range(0, len(ids), chunk)]
        rows = np.concatenate([chunked.feed(run, len(run)) for run in runs])
        _compare(a, rows, out["classic_chunked"])
        logits = a[-1]
        for _ in range(steps):
            idx = int(np.argmax(logits))
            tok = int(draft_vocab[idx]) if draft_vocab is not None else idx
            la, lb = old.feed([tok]), new.feed([tok])
            _compare(la, lb, out["greedy_steps"])
            logits = la[-1]
    for phase in phases:
        d = out[phase]
        d["top1_agreement"] = d.pop("top1_equal") / max(1, d["positions"])
    return out


def parity_check(model, onnx_path: Path, vocab_size: int, prompt_len: int = 7, more: int = 2,
                 seed: int = 0) -> tuple[float, float]:
    """Max |ONNX - torch| of the logits: prompt with empty past, then ``more`` tokens with its KV.

    The torch side is the plain HF model with its own cache (not the export wrapper), so the check
    covers the wrapper too.
    """
    import inspect

    import torch

    rng = np.random.default_rng(seed)
    prompt = rng.integers(0, vocab_size, (1, prompt_len), dtype=np.int64)
    nxt = rng.integers(0, vocab_size, (1, more), dtype=np.int64)
    runner = ClassicRunner(onnx_path, threads=0)
    logits1 = runner.feed(prompt[0].tolist(), prompt_len)
    logits2 = runner.feed(nxt[0].tolist(), more)
    with torch.no_grad():
        out1 = model(input_ids=torch.from_numpy(prompt), use_cache=True)
        cache = out1.cache if hasattr(out1, "cache") else out1.past_key_values
        kw = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
        pos = torch.arange(prompt_len, prompt_len + more).unsqueeze(0)
        out2 = model(input_ids=torch.from_numpy(nxt), position_ids=pos, use_cache=True, **{kw: cache})
    d1 = float(np.abs(logits1 - out1.logits[0].float().numpy()).max())
    d2 = float(np.abs(logits2 - out2.logits[0].float().numpy()).max())
    return d1, d2
