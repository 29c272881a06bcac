# One device call: speculative decoding on the H200, one stream, the real embedded model
# (SmolLM2-135M-Instruct, its wheel joined in /tmp/smol beforehand), bench/speculative.py's
# editing and summarising workloads streamed over HTTP to each server in turn, each alone on
# the GPU:
#
#   kern        kern serve, no flags                    (kern's own plain decoding)
#   kern-ngram  kern serve --speculate ngram:$K
#   vllm        vLLM 0.26, no flags
#   vllm-ngram  vLLM with its n-gram speculation: --speculative-config
#               '{"method":"ngram","num_speculative_tokens":K,"prompt_lookup_max":4}'
#
# First, in process (bench/speculative.py --target cuda): the model loaded twice on the GPU, plain
# and speculating, each prompt decoded by both, the tokens checked the same, the ratio of their
# decode tok/s (one JSON line a workload with "same_tokens"). Last, one line a workload: each
# server's tok/s over kern plain's.
#
# K: tokens a round (default 8). PEER=vllm|none (default vllm). vLLM 0.26 comes as wheel parts
# copied to /tmp/vw by earlier calls (joined and installed here, in the background while kern
# runs), as bench/serve_gpu.sh does. JSON lines (tok/s a workload, from each request's first
# token to its last) land under $OUT; the summary is printed.
#
#   run(command="python3 bench/gpu.py --preset speculative", carry=[".whl"], timeout_s=600)
: "${OUT:?run through bench/gpu.py --preset speculative (it sets OUT, PYTHONPATH and KERN_CACHE)}"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee $OUT/gpu.txt
K=${K:-8}
PEER=${PEER:-vllm}

if [ "$PEER" = vllm ]; then
  ( cat /tmp/vw/p_* > /tmp/vw.tar && mkdir -p /tmp/vwh && tar xf /tmp/vw.tar -C /tmp/vwh \
    && python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/vsite /tmp/vwh/*.whl \
    && touch /tmp/vsite.ok ) > $OUT/vllm_install.log 2>&1 &
fi

# the embedded model's checkpoint folder (converted from its GGUF once, as kern run does)
CKPT=$(python3 -c "from kern.deployments import default_model; print(default_model(progress=False))") \
  || { echo "the embedded model is not available (its wheel in /tmp/smol?)"; exit 1; }

. bench/servers.sh  # up, stop, served

timeout ${INPROCESS_S:-150} python3 bench/speculative.py --target cuda --speculate ngram:$K \
  >> $OUT/speculative.jsonl 2> $OUT/inprocess_bench.log || tail -5 $OUT/inprocess_bench.log

measure() {  # $1 label, $2 url
  timeout ${MEASURE_S:-150} python3 bench/speculative.py --url $2 --label $1 >> $OUT/speculative.jsonl \
    2>> $OUT/$1_bench.log
}

run_kern() {  # $1 label, then kern serve's flags
  local label=$1; shift
  T0=$(date +%s.%N)
  python3 -m kern.cli serve $CKPT --port 8100 "$@" > $OUT/${label}_serve.log 2>&1 &
  local pid=$!
  served $label http://127.0.0.1:8100 ${KERN_UP_S:-130} $pid $T0 $OUT $OUT/${label}_serve.log
  python3 -c "import urllib.request; print(urllib.request.urlopen('http://127.0.0.1:8100/metrics').read().decode())" \
    2> /dev/null | grep '^kern_speculative' > $OUT/${label}_metrics.txt
  stop $pid
}

run_kern kern
run_kern kern-ngram --speculate ngram:$K

if [ "$PEER" = vllm ]; then
  for _ in $(seq 1 120); do [ -f /tmp/vsite.ok ] && break; sleep 1; done
  run_vllm() {  # $1 label, then vLLM's flags
    local label=$1; shift
    T0=$(date +%s.%N)
    PYTHONPATH=/tmp/vsite HF_HUB_OFFLINE=1 python3 -m vllm.entrypoints.openai.api_server --model $CKPT --port 8102 \
      --max-model-len 4096 "$@" > $OUT/${label}_serve.log 2>&1 &
    local pid=$!
    served $label http://127.0.0.1:8102 ${VLLM_UP_S:-300} $pid $T0 $OUT $OUT/${label}_serve.log
    stop $pid
  }
  run_vllm vllm
  run_vllm vllm-ngram --speculative-config \
    "{\"method\":\"ngram\",\"num_speculative_tokens\":$K,\"prompt_lookup_max\":4}"
fi

echo "speculative, one stream, the embedded model (tok/s a workload):"
cat $OUT/speculative.jsonl
python3 - $OUT/speculative.jsonl <<'EOF'
import json, sys
rows = [json.loads(ln) for ln in open(sys.argv[1]) if ln.startswith("{")]
tok = {(r["workload"], r["label"]): r["tok_s"] for r in rows if "label" in r and "workload" in r}
for w in dict.fromkeys(w for w, _ in tok):
    base = tok.get((w, "kern"))
    if base:
        print(json.dumps({"workload": w, "over_kern_plain": {lab: round(v / base, 2) for (ww, lab), v in tok.items()
                                                             if ww == w and lab != "kern"}}))
EOF
cat $OUT/kern-ngram_metrics.txt 2> /dev/null
# what comes back is at most 8 files: the logs travel as one archive
tar czf $OUT/logs.tgz -C $OUT $(cd $OUT && ls *.log *.txt 2>/dev/null) && (cd $OUT && rm -f $(cd $OUT && ls *.log | grep -vx speculative.log) *_metrics.txt)  # bench/gpu.py reads speculative.log after
