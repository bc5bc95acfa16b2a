"""serve-drafter with its decoder's forwards counted (rows and calls, written to /tmp/b31/node_counts.txt each 2 s)."""
import os, sys, threading, time, collections
sys.path.insert(0, os.getcwd())
from verifier_service import decoder as D
counts = collections.Counter()
orig = D.Decoder._forward
def counted(self, blocks, keep=None):
    counts["calls"] += 1
    counts["rows"] += sum(len(ids) for _, ids in blocks)
    counts[f"w{sum(len(ids) for _, ids in blocks)}"] += 1
    t0 = time.thread_time()
    try:
        return orig(self, blocks, keep)
    finally:
        counts["cpu_ms"] += int((time.thread_time() - t0) * 1e3)
D.Decoder._forward = counted
def dump():
    while True:
        time.sleep(2)
        open("/tmp/b31/node_counts.txt", "w").write(repr(dict(counts)))
threading.Thread(target=dump, daemon=True).start()
from tandem.cli import main
sys.argv = ["tandem", "serve-drafter", *sys.argv[1:]]
main()
