#!/bin/bash
# serve_rss.sh: tandem up with a separate verifier; the verifier's VmHWM / VmRSS after each of the 13 bench prompts
# (TGT=default DRF=default, PC=prefix cache MiB, default 0), then its largest mappings
# serve Gemma with a separate verifier, no prefix cache; run the 13 bench prompts; print verifier smaps summary
cd /work/main; export HF_HUB_OFFLINE=1 TANDEM_PREFIX_CACHE_MB=${PC:-0}
G=${TGT:-/root/.cache/tandem/models/gemma-3-270m-q4_k_m.gguf}
.venv/bin/tandem up --target $G --drafter ${DRF:-suffix} --separate-verifier --verifier-threads 2 --gateway-port 50071 --http-port 0 > /tmp/b36/up2.log 2>&1 &
for i in $(seq 90); do sleep 2; grep -q "try:" /tmp/b36/up2.log && break; done
VP=$(pgrep -f "serve-verifier" | head -1)
echo "after start: $(grep -E 'VmHWM|VmRSS' /proc/$VP/status | tr '\n' ' ')"
.venv/bin/python - <<'PY'
import json
qs=[json.loads(l) for l in open('/work/shared/data/spec_bench/question.jsonl')]
seen=set(); out=[]
for q in qs:
    if q['category'] in seen: continue
    seen.add(q['category']); out.append(q['turns'][0])
open('/tmp/b36/prompts.txt','w').write('\n'.join(json.dumps(p) for p in out))
PY
while read -r line; do
  p=$(python3 -c "import json,sys; print(json.loads(sys.argv[1]))" "$line")
  .venv/bin/tandem generate --gateway 127.0.0.1:50071 --max-tokens 128 "$p" > /dev/null 2>&1
  echo "$(grep -E 'VmHWM|VmRSS' /proc/$VP/status | tr '\n' ' ')"
done < /tmp/b36/prompts.txt
awk '/^[0-9a-f]+-[0-9a-f]+ /{name=$6; range=$1} /^Rss:/{if($2>2000) print $2, range, name}' /proc/$VP/smaps | sort -rn | head -14
pkill -f "tandem up"
