import json, sys, collections, statistics as st
r = json.load(open(sys.argv[1]))
for mode in sorted({s["mode"] for s in r["samples"]}):
    S = [s for s in r["samples"] if s["mode"] == mode]
    agg = collections.defaultdict(lambda: collections.defaultdict(float))
    vw = collections.defaultdict(list)
    tot_round = tot_stream = wall = dec = 0
    for s in S:
        R = s["rounds"]; n = len(R["k"])
        wall += s["wall_ms"]; dec += s["wall_ms"] - s["ttft_ms"]
        for i in range(n):
            src = R["source"][i] or "plain"
            a = agg[src]
            a["n"] += 1; a["prop"] += R["proposed"][i]; a["acc"] += R["accepted"][i]; a["em"] += R["emitted"][i]
            a["verify"] += R["verify_ms"][i]; a["round"] += R["round_ms"][i]; a["stream"] += R["stream_ms"][i]
            a["wire"] += R["wire_ms"][i]; a["gw"] += R["gateway_ms"][i]; a["draft"] += R["draft_ms"][i]
            vw[R["proposed"][i] + 1].append(R["verify_ms"][i])
    print(f"== {mode}: wall {wall/1e3:.1f}s decode {dec/1e3:.1f}s")
    for src, a in agg.items():
        n = a["n"]
        print(f"  {src:6s} n {n:5.0f} prop {a['prop']/n:.2f} acc {a['acc']/n:.2f} emit {a['em']/n:.2f} verify {a['verify']/n:.1f} round {a['round']/n:.1f} stream {a['stream']/n:.2f} wire {a['wire']/n:.2f} gw {a['gw']/n:.2f} draft {a['draft']/n:.2f}  sum round {a['round']/1e3:.1f}s stream {a['stream']/1e3:.1f}s")
    print("  verify ms by width:", {w: (len(v), round(st.median(v), 1)) for w, v in sorted(vw.items())})
