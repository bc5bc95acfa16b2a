"""The verifier: the target model (PyTorch + transformers) with a KV cache per session.

``target.Target`` prefills prompts and verifies draft blocks in one forward pass each, on
``target_model.TargetModel`` (which path runs the model, loading it, the forward, warm-up),
``acceptance`` holds the exactness rule, ``kv_cache`` the sessions and the rollback,
``servicer``/``server`` the gRPC boundary.
"""
