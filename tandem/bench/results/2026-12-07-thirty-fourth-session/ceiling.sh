#!/bin/bash
# Issue 28's ceiling in one sitting: the two cores' fp32 FMA peak (fma_peak.c, both CPUs at once) before and
# after the default target's forward costs at widths 1/4/8 and 4/8 sessions of one row.
# bash ceiling.sh   (from the repository root; builds fma_peak.c into /tmp)
D=$(dirname "$0")
gcc -O2 -march=native -o /tmp/fma_peak "$D/fma_peak.c"
peak() { (taskset -c 0 /tmp/fma_peak > /tmp/p0.txt & taskset -c 1 /tmp/fma_peak > /tmp/p1.txt; wait); echo "CPU0: $(tr '\n' ' ' < /tmp/p0.txt)"; echo "CPU1: $(tr '\n' ' ' < /tmp/p1.txt)"; }
peak
HF_HUB_OFFLINE=1 .venv/bin/python -m tandem.bench.forward_costs --threads 2 --widths 1,4,8 --context 150 --repeats 9 --sessions 4,8 2>&1 | grep -E "^\||bit-identical|CPU:"
peak
