#!/bin/bash
# usage: ab.sh tag n [extra args]
tag=$1; n=$2; shift 2
source /work/main/.venv/bin/activate; export HF_HUB_OFFLINE=1
for i in $(seq 1 $n); do
  for v in new base; do
    d=/work/main; [ $v = base ] && d=/tmp/b24/base
    (cd $d && python -m tandem.bench.repeated --passes 2 --per-category 2 --max-tokens 64 --verifier-threads 2 --out /tmp/b24/$tag-$v-$i.json "$@" > /tmp/b24/$tag-$v-$i.log 2>&1)
  done
done
python - "$tag" <<'PY'
import json,glob,sys
tag=sys.argv[1]
for v in ("new","base"):
    for f in sorted(glob.glob(f"/tmp/b24/{tag}-{v}-*.json")):
        s=json.load(open(f))['summary']
        out=[]
        for p in sorted(s):
            a=s[p]['all']; out.append(f"{p}: {a['speedup']}x tau {a['mean_acceptance_length']} {a['identical']}")
        print(v, f.split('/')[-1], " | ".join(out))
PY
