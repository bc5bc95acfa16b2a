"""A deliberately useless drafter for the benchmark: random weights, the target's tokenizer, exported to
ONNX with the project's own tooling. Its model tokens are almost never accepted, so it shows whether the
automatic draft length turns speculation off where it loses (prompt lookup in front of it still finds
copies in the context, as it would for any drafter).

    python -m tandem.bench.random_drafter --out /tmp/useless-drafter      # then: tandem bench --drafter DIR
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path


def make(out: Path, target: str = "default", hidden: int = 64, layers: int = 1, seed: int = 0) -> Path:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from tandem.export import export_drafter
    from tandem.models import load_tokenizer

    tokenizer = load_tokenizer(target)
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=hidden, intermediate_size=hidden * 2,
                         num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=8192, bos_token_id=tokenizer.bos_token_id,
                         eos_token_id=tokenizer.eos_token_id, tie_word_embeddings=False)
    with tempfile.TemporaryDirectory() as tmp:
        LlamaForCausalLM(config).save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        export_drafter(tmp, out, check=False)
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, type=Path, help="directory for model.onnx + drafter.json")
    p.add_argument("--target", default="default", help="whose tokenizer (vocabulary) the drafter uses")
    args = p.parse_args(argv)
    print(make(args.out, args.target))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
