"""`python -m tandem.bench.forward_costs` times forwards as the verifier runs them: on its torch thread."""
from __future__ import annotations

from tandem.bench import forward_costs
from tiny_models import make_tokenizer
from verifier_service import torch_thread
from verifier_service.decoder import Decoder
from verifier_service.gguf_model import GgufModel
from verifier_service.target import Target


def test_every_timed_forward_runs_on_the_torch_thread(tiny_gguf_files, monkeypatch, capsys):
    """Forwards from a second thread give the process two OpenMP teams, and libgomp then sleeps between
    parallel regions: the bench timed 2 threads slower than 1 (29-38 ms against 20 ms a forward on 2 cores,
    11.6 ms once on the torch thread)."""
    threads = []
    forward = Decoder.forward

    def recorded(self, *args, **kwargs):
        threads.append(torch_thread.on_torch_thread())
        return forward(self, *args, **kwargs)

    monkeypatch.setattr(Decoder, "forward", recorded)
    monkeypatch.setattr(Target, "load", classmethod(lambda cls, spec, widths=(1,), **kw: cls(
        GgufModel(spec), make_tokenizer(260), "tiny", widths=widths, warmup=False)))     # no tokenizer in the file
    assert forward_costs.main(["--target", str(tiny_gguf_files["llama"]), "--widths", "1,2", "--context", "8",
                               "--repeats", "1", "--sessions", "2,3"]) == 0
    out = capsys.readouterr().out
    assert "| 2 |" in out and "rows bit-identical across widths" in out
    # several sessions of one row against one session's block of as many rows, each row its plain step's bits
    assert "| 3 | " in out.split("| sessions |")[1]
    assert "each session's row in a shared forward bit-identical to its plain step alone: True" in out
    assert threads and all(threads), f"{threads.count(False)} of {len(threads)} forwards off the torch thread"
