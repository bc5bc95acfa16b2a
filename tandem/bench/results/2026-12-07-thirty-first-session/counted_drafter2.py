# Runs on branch experiment/near-tie-branches (it counts that branch's forks and promotions).
import os, sys, threading, time, collections
sys.path.insert(0, os.getcwd())
from drafter_service import gguf_drafter as GD
counts = collections.Counter()
orig_res = GD.GgufDrafter.resolve_branch
def res(self, sid, context, token=None):
    s = self.sessions.get(sid, token)
    b = s.kv[0].branch if s is not None else None
    out = orig_res(self, sid, context, token)
    if b is not None:
        if out is not None: counts["promoted"] += 1; counts["promoted_tokens"] += len(out[1])
        elif b.settled(context):
            n = min(len(context), b.position)
            if context[:n] != b.prefix[:n]: counts["dropped_diverged_before"] += 1
            elif context[b.position] == b.main: counts["dropped_main_won"] += 1
            elif context[b.position] == b.tokens[0]: counts["runner_up_won_but_not_promoted"] += 1
            else: counts["dropped_other_token"] += 1
    return out
GD.GgufDrafter.resolve_branch = res
orig_fork = GD.GgufDrafter._fork
def fork(self, state, logits, top):
    had = state.kv[0].branch
    orig_fork(self, state, logits, top)
    if had is None and state.kv[0].branch is not None: counts["forks"] += 1
GD.GgufDrafter._fork = fork
def dump():
    while True:
        time.sleep(2); open("/tmp/b31/node_counts2.txt", "w").write(repr(dict(counts)))
threading.Thread(target=dump, daemon=True).start()
from tandem.cli import main
sys.argv = ["tandem", "serve-drafter", *sys.argv[1:]]
main()
