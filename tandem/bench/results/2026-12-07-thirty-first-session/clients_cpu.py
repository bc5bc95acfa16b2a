"""N streaming HTTP clients in threads (as tandem bench --concurrency sends them) against tandem up: the
clients' own CPU (this process) against the wall time and the server's tokens."""
import os, sys, threading, time
sys.path.insert(0, os.getcwd())
from tandem.bench.http_stream import chat_body, stream_chat
url = sys.argv[1]; n = int(sys.argv[2])
texts = ["Write a story about a robot learning to paint.", "Explain how vaccines work.",
         "Describe a day in the life of a lighthouse keeper.", "What are the benefits of learning a second language?"]
out = []
def client(i):
    for j in range(2):
        s = stream_chat(url, chat_body(texts[(i + j) % 4], 96, ignore_eos=True))
        out.append(s.get("new_tokens", 0))
c0 = time.process_time(); t0 = time.perf_counter()
th = [threading.Thread(target=client, args=(i,)) for i in range(n)]
[t.start() for t in th]; [t.join() for t in th]
wall = time.perf_counter() - t0; cpu = time.process_time() - c0
print(f"{n} clients: {sum(out)} tokens in {wall:.2f} s = {sum(out)/wall:.1f} tok/s; clients' CPU {cpu:.2f} s = {100*cpu/(2*wall):.1f} % of 2 cores, {1e3*cpu/sum(out):.3f} ms a token")
