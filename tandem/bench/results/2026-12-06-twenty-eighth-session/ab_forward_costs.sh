#!/bin/bash
# forward_costs alternated between this tree (new) and /tmp/base (old, 23d9483): TGT, CTX
export HF_HUB_OFFLINE=1
for rep in 1 2; do
  for tree in /work/main /tmp/base; do
    echo "== $tree rep $rep $(date +%T)"
    (cd $tree && timeout 600 /work/main/.venv/bin/python -m tandem.bench.forward_costs --target $TGT --threads 2 --widths 1,4,8 --context $CTX --repeats 8 2>&1 | grep -E "^\| [0-9]|prefill of")
  done
done
