"""`tandem distill`: train a small drafter for a target (sequence-level + logit distillation).

Needs torch and transformers (the verifier/export extra); the drafter service never imports it.

Modules:
  * ``data``     the training split, teacher passes (target top-k logits over text), generation of
                 target answers (training samples and held-out greedy references);
  * ``student``  building the drafter: a small Llama with the target's tokenizer, embeddings from
                 a low-rank (SVD) projection of the target's, an optional reduced draft vocabulary;
  * ``train``    the training loop (AdamW, cosine, seeds, checkpoints, resume, progress bar);
  * ``evaluate`` offline speculative-decoding simulation (tau) and the drafter/target cost ratio;
  * ``card``     the model card and data manifest written beside the weights;
  * ``cli``      ``configure(parser)`` / ``run(args)`` for ``tandem distill``.
"""
