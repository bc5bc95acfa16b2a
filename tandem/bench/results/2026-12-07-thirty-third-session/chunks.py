import sys, statistics as st, collections
lines=[l.split() for l in open(sys.argv[1]) if l.startswith('TRACE')]
seen=set(); per=collections.defaultdict(list); tot_ms=tot_tok=0
for l in lines:
    if l[1]=='draft-end':
        p=int(l[4]); got=int(l[6]); ms=float(l[8]); first=p not in seen; seen.add(p)
        if got>0: tot_ms+=ms; tot_tok+=got
        if got>0 and not first: per[got].append(ms/got)
print(" ".join(f"chunks of {g}: {st.median(per[g]):.2f} ms/token (n {len(per[g])})" for g in (2,3,8) if per[g]), f"| all: {tot_tok} tokens, {tot_ms/tot_tok:.2f} ms/token")
