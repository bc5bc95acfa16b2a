"""``python -m tandem.distill.suffix_seed``: a drafter directory's suffix seed from the target's answers.

Global suffix drafting (drafter_service/suffix.py) proposes what followed the context's longest recurring
suffix in the text it holds. A new drafter holds nothing; seeded with answers its target wrote to other
questions, it starts with the target's habits (its openings, list scaffolding, closing lines). This writes
those answers' outputs (never their prompts) as a seed file (drafter_service/suffix_store.py) that the
drafter reads at start when suffix drafting is on (``--suffix-seed auto``: a drafter directory's
``suffix_seed.jsonl.gz``).

Input: JSON-lines records with ``output_ids`` (the distillation corpus format, tandem/distill/data.py);
records of held-out Spec-Bench questions are refused, so benchmarks never draft from their own answers.
"""

from __future__ import annotations

import argparse
import sys

from drafter_service import suffix_store

from . import data


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tandem.distill.suffix_seed", description=__doc__.split("\n\n")[0])
    p.add_argument("--data", action="append", default=None, help="records (JSONL with output_ids); repeatable; "
                   f"default: the shared corpus ({data.DEFAULT_CORPUS})")
    p.add_argument("--out", required=True, help="the seed file to write (e.g. drafters/<name>/suffix_seed.jsonl.gz)")
    p.add_argument("--max-tokens", type=int, default=400_000, help="most answer tokens kept (the first records)")
    args = p.parse_args(argv)
    answers, kept = [], 0
    for path in args.data or [str(data.DEFAULT_CORPUS)]:
        for rec in data.load_jsonl_records(path):
            if kept + len(rec.output_ids) > args.max_tokens:
                break
            answers.append(rec.output_ids)
            kept += len(rec.output_ids)
    written = suffix_store.write_sequences(answers, args.out)
    print(f"[suffix-seed] {written} tokens in {len(answers)} answers -> {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
