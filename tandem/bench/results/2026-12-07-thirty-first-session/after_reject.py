import json, sys, collections
r = json.load(open(sys.argv[1]))
for mode in r['modes']:
    if 'auto' not in mode: continue
    nxt = collections.Counter(); plains_after = []
    for s in r['samples']:
        if s['mode'] != mode: continue
        R = s['rounds']; n = len(R['k'])
        for i in range(n):
            if R['proposed'][i] > R['accepted'][i]:
                j = i + 1; c = 0
                while j < n and (R['source'][j] or 'p') == 'p': c += 1; j += 1
                plains_after.append(c)
                if i + 1 < n: nxt[R['source'][i+1] or 'plain'] += 1
    print(mode[-40:], "rejections", len(plains_after), "next round:", dict(nxt), "mean plain rounds after", round(sum(plains_after)/max(1,len(plains_after)),2))
