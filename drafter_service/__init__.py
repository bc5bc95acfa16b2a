"""The drafter service: proposes draft blocks with the exact q they were sampled from. No torch here.

Nothing in this package imports torch or transformers, but the ``gguf`` kind when it is asked for
(``gguf_drafter``: the target's own file through the verifier's decoder): a drafter machine serving an ONNX
drafter or suffix drafting needs only numpy, onnxruntime and grpc. ``drafter`` defines the interface the servicer calls (and ``ContextDrafter``, the
session and context bookkeeping every kind shares); ``model_drafter`` is the ``model`` kind (an ONNX
decoder with a KV cache per session, chunked prefill); ``lookup_drafter`` wraps any kind with prompt
lookup; ``factory.load_drafter`` picks the kind named in ``drafter.json``; ``onnx_drafter.OnnxDrafter``
is lookup around the model kind in one constructor; ``sampling`` the numpy warping and sampling.
"""
