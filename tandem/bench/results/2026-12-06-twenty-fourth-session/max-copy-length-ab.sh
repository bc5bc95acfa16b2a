#!/bin/bash
tag=$1; n=$2; shift 2
source /work/main/.venv/bin/activate; export HF_HUB_OFFLINE=1
cd /work/main
for i in $(seq 1 $n); do
  for m in 16 8; do
    TANDEM_MAX_COPY_LENGTH=$m python -m tandem.bench.repeated --passes 2 --per-category 2 --max-tokens 64 --verifier-threads 2 --out /tmp/b24/$tag-c$m-$i.json "$@" > /tmp/b24/$tag-c$m-$i.log 2>&1
  done
done
python - "$tag" <<'PY'
import json,glob,sys
tag=sys.argv[1]
for v in ("c16","c8"):
    for f in sorted(glob.glob(f"/tmp/b24/{tag}-{v}-*.json")):
        s=json.load(open(f))['summary']
        print(v, f.split('/')[-1], " | ".join(f"{p}: {s[p]['all']['speedup']}x tau {s[p]['all']['mean_acceptance_length']} {s[p]['all']['identical']}" for p in sorted(s)))
PY
