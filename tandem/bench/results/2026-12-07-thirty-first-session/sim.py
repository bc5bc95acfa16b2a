"""Pipeline model: node drafts tokens every d ms along the path from each restart; rounds verify what arrived
(never wait) or wait for kmin tokens. Rejection per drafted token with prob p. Returns ms per emitted token."""
import random, statistics as st
def run(policy_kmin, d=5.7, first=8.0, F=12.5, c=4.3, p=0.025, kmax=8, chunk=2, N=20000, seed=1, maxwait=30.0):
    rng = random.Random(seed)
    t = 0.0; emitted = 0
    # node: path restart at time r0, position base (sequence index where path starts)
    r0 = 0.0; base = 0; seq = 0
    def arrived(now):   # tokens of the path arrived by 'now' (chunked): first token alone, then pairs
        if now < r0 + first: return 0
        n = 1 + int((now - r0 - first) / d)
        if n > 1: n = 1 + ((n - 1) // chunk) * chunk
        return n
    while emitted < N:
        ready = max(0, base + arrived(t) - seq)
        if ready < policy_kmin:
            # wait until kmin arrive, or maxwait
            tt = t
            while max(0, base + arrived(tt) - seq) < policy_kmin and tt - t < maxwait: tt += 0.25
            t = tt; ready = max(0, base + arrived(t) - seq)
        k = min(ready, kmax)
        cost = F + c * k
        t += cost
        # acceptance of the k drafted tokens
        acc = 0
        while acc < k and rng.random() > p: acc += 1
        if acc < k:     # rejection: the path restarts at the sync
            seq += acc + 1; emitted += acc + 1
            r0 = t; base = seq
        else:
            seq += k + 1; emitted += k + 1
            # the bonus: node's token at that position equals it with 1-p; else restart
            if rng.random() < p: r0 = t; base = seq
    return t / emitted
for kmin in (0, 1, 2, 3, 4):
    print(kmin, [round(run(kmin, seed=s), 2) for s in (1, 2)])
print("plain", 12.5)
