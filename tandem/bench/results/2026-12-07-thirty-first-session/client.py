import os, sys, time
sys.path.insert(0, os.getcwd())
from tandem.bench.gateway_runner import GatewayRunner
from tandem.bench import modes as M
from tandem.bench.settings import Settings
from tandem.bench.workload import Prompt
port, mode, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
r = GatewayRunner(f"127.0.0.1:{port}")
m = M.BASELINE_MODE if mode == "plain" else M.AUTO_MODE
p = Prompt(question_id=1, category="x", text="Compose an engaging travel blog post about a recent trip to Hawaii.")
for i in range(n):
    s = r.run(m, p, Settings(max_tokens=128))
    print(s["new_tokens"], round(s["wall_ms"]), flush=True)
