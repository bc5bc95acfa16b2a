import os, sys, time
os.environ["HF_HUB_OFFLINE"]="1"; sys.path.insert(0, os.getcwd())
import torch, numpy as np
from verifier_service import torch_thread
from verifier_service.target import Target
torch_thread.run(torch.set_num_threads, 2)
t = Target.load(sys.argv[1], warmup=False)
d = t.decoder
def go():
    with torch.inference_mode():
        for probe in ([(7 * i + 3) % d.spec.vocab for i in range(40)], t.tokenizer("The capital of France is Paris. The capital of Germany is")["input_ids"]):
            hidden = d._hidden([(d.new_cache(), probe)])[1][-8:].clone()
            for w in (1, 1, 1, 2, 4):
                h = hidden[:w].contiguous()
                c = d.greedy_head.candidates_of(h)
                out = torch.empty(w, d.spec.vocab)
                t0=time.perf_counter(); d.greedy_head.logits_into(h, out); t1=time.perf_counter(); d.weights.head.matmul_into(h, out); t2=time.perf_counter()
                print(w, [len(x) for x in c] if c else c, "greedy %.2f full %.2f" % ((t1-t0)*1e3, (t2-t1)*1e3))
torch_thread.run(go)
