"""Per-thread CPU seconds of every process whose cmdline matches, over a window: python cpu_threads.py SECONDS PATTERN..."""
import os, sys, time
secs, pats = float(sys.argv[1]), sys.argv[2:]
hz = os.sysconf("SC_CLK_TCK")
def snap():
    out = {}
    for pid in os.listdir("/proc"):
        if not pid.isdigit(): continue
        try:
            cmd = open(f"/proc/{pid}/cmdline", "rb").read().replace(b"\0", b" ").decode()
        except OSError: continue
        if not any(p in cmd for p in pats) or "cpu_threads" in cmd: continue
        for tid in os.listdir(f"/proc/{pid}/task"):
            try:
                st = open(f"/proc/{pid}/task/{tid}/stat").read()
                comm = st[st.index("(") + 1: st.rindex(")")]
                f = st[st.rindex(")") + 2:].split()
                out[(pid, tid)] = (cmd[:60], comm, (int(f[11]) + int(f[12])) / hz)
            except (OSError, ValueError): pass
    return out
a = snap(); time.sleep(secs); b = snap()
rows = sorted(((b[k][2] - a[k][2], k, b[k][0], b[k][1]) for k in b if k in a), reverse=True)
for d, k, cmd, comm in rows:
    if d > 0: print(f"{d:6.2f} s  {k[0]:>7}/{k[1]:<7} {comm:<16} {cmd}")
