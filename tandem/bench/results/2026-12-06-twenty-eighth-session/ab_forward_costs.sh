#!/bin/bash
# forward_costs alternated between two trees: NEW (default: this one) and OLD (a worktree of 23d9483).
# TGT, CTX: the target and the context, e.g. TGT=default CTX=300 OLD=/tmp/base bash ab_forward_costs.sh
export HF_HUB_OFFLINE=1
for rep in 1 2; do
  for tree in "${NEW:-$PWD}" "${OLD:?a tree of the old commit}"; do
    echo "== $tree rep $rep $(date +%T)"
    (cd $tree && timeout 600 python -m tandem.bench.forward_costs --target $TGT --threads 2 --widths 1,4,8 --context $CTX --repeats 8 2>&1 | grep -E "^\| [0-9]|prefill of")
  done
done
