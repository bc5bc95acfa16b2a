import json, sys, collections, statistics as st
r = json.load(open(sys.argv[1]))
for mode in r['modes']:
    agg = collections.defaultdict(lambda: [0,0,0,[],[],[]])
    for s in r['samples']:
        if s['mode'] != mode or not s.get('rounds'): continue
        R = s['rounds']
        for i in range(len(R['k'])):
            src = R['source'][i]; a = agg[src]
            a[0] += 1; a[1] += R['proposed'][i]; a[2] += R['accepted'][i]
            a[3].append(R['verify_ms'][i]); a[4].append(R['round_ms'][i]); a[5].append(R['draft_ms'][i])
    print(mode)
    for src, a in sorted(agg.items()):
        print(f"  {src:8s} rounds {a[0]:5d} proposed {a[1]:5d} accepted {a[2]:5d} ({a[2]/max(1,a[1]):.2f})  verify {st.median(a[3]):.1f} round {st.median(a[4]):.1f} draft {st.median(a[5]):.1f} ms")
