"""The drafter service: a small causal LM run by ONNX Runtime that proposes draft blocks.

Nothing in this package imports torch or transformers: a drafter machine needs only numpy,
onnxruntime and grpc. ``onnx_drafter`` holds the model, its per-session KV caches and the drafting
loop, ``sampling`` the numpy warping and sampling, ``sessions`` the session store.
"""
