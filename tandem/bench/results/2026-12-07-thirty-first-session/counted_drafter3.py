import os, sys, threading, time, collections
sys.path.insert(0, os.getcwd())
from drafter_service import ahead as A
counts = collections.Counter()
orig_draft = A.AheadPath.draft
def draft(self):
    with self._lock: pid = self.path_id; real = len(self.context); held = len(self.path)
    c = orig_draft(self)
    if c is not None:
        counts["chunks"] += 1; counts["tokens"] += len(c.tokens)
        ahead_of_real = c.position + len(c.tokens) - real
        counts["ahead>16" if ahead_of_real > 16 else "ahead<=16"] += len(c.tokens)
    else:
        counts["void"] += 1
    return c
A.AheadPath.draft = draft
orig_sync = A.AheadPath.sync
def sync(self, position, appended, ahead):
    with self._lock: pid = self.path_id; held = len(self.path); real = len(self.context)
    orig_sync(self, position, appended, ahead)
    with self._lock:
        if self.path_id != pid and real > 0:
            counts["restarts"] += 1; counts["dropped_tokens"] += held
    counts["syncs"] += 1; counts[f"ahead_req_{min(ahead, 64)//16}"] += 1
A.AheadPath.sync = sync
def dump():
    while True:
        time.sleep(2); open("/tmp/b31/node_counts3.txt", "w").write(repr(dict(counts)))
threading.Thread(target=dump, daemon=True).start()
from tandem.cli import main
sys.argv = ["tandem", "serve-drafter", *sys.argv[1:]]
main()
