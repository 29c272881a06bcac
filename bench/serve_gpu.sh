# One device call: kern serve, started with no flags, against a peer server on the same HTTP
# workload (bench/serve.py: streamed chat requests, 512-token prompts sharing a 256-token system
# prompt, 128 output tokens, greedy) at each concurrency of $CONC, one stream alone (128-token
# prompt, 512 out) and long prompts ($LONG_PROMPT tokens at concurrency 8), on a seeded random
# checkpoint of $SHAPE (default llama-3.2-1b) made here. The servers run one after the other, each alone on
# the GPU. Logs and JSON lines land under $OUT; the summary is also printed.
#
#   KERN_FLAGS: flags for kern serve (default none: what a user gets), e.g. --no-batch-invariance.
#   PEER=vllm|transformers|none (default transformers). vLLM 0.26 comes as wheel parts copied
#   to /tmp/vw by earlier calls (joined and installed here, in the background while kern runs).
#
# bench/gpu.py runs it with the carried wheels installed and kern installed from this tree:
#
#   run(command="python3 bench/gpu.py --preset serve", carry=[".whl"], timeout_s=600)
: "${OUT:?run through bench/gpu.py --preset serve (it sets OUT, PYTHONPATH and KERN_CACHE)}"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee $OUT/gpu.txt
CKPT=/tmp/serve-ckpt
CONC=${CONC:-1,8,32,128,256}
PEER=${PEER:-transformers}
KERN_FLAGS=${KERN_FLAGS:-}
LONG_PROMPT=${LONG_PROMPT:-8192}
SHAPE=${SHAPE:-llama-3.2-1b}  # a shape of kern_models.common.random_checkpoint (llama-3.1-8b: the issue's second)
WORK="--prompt 512 --shared 256 --output 128"

if [ "$PEER" = vllm ]; then  # join and install vLLM's wheels while kern runs (CPU only)
  ( cat /tmp/vw/p_* > /tmp/vw.tar && mkdir -p /tmp/vwh && tar xf /tmp/vw.tar -C /tmp/vwh \
    && python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/vsite /tmp/vwh/*.whl \
    && touch /tmp/vsite.ok ) > $OUT/vllm_install.log 2>&1 &
fi

# the real Llama-3.2-1B's 131,072 positions (kern serves 32,768 of them, vLLM what --max-model-len says)
timeout ${CKPT_S:-90} python3 -c "from kern_models.common.random_checkpoint import make; make('$SHAPE', '$CKPT', device='cuda', max_positions=131072)" \
  > $OUT/checkpoint.log 2>&1 || { tail -5 $OUT/checkpoint.log; exit 1; }
python3 bench/serve.py --prepare $CKPT

. bench/servers.sh  # up, stop, served

measure() {  # $1 label, $2 url: the lone stream, the curve, the long prompts (JSON lines in $OUT/$1.jsonl)
  local conc=${CONC//,/ }
  [ "${LONE:-1}" = 1 ] && timeout ${LONE_S:-60} python3 bench/serve.py --url $2 --label $1 --requests 4 --warmup 1 \
    --prompt 128 --shared 0 --output 512 --concurrency 1 >> $OUT/$1_lone.jsonl 2>> $OUT/$1_bench.log
  for c in $conc; do
    n=$((c * 2)); [ $n -lt 32 ] && n=32; [ $n -lt 256 ] && [ $c -ge 32 ] && n=256
    timeout ${CURVE_S:-90} python3 bench/serve.py --url $2 --label $1 --requests $n $WORK --concurrency $c \
      >> $OUT/$1.jsonl 2>> $OUT/$1_bench.log
  done
  [ "$LONG_PROMPT" -gt 0 ] && timeout ${LONG_S:-90} python3 bench/serve.py --url $2 --label $1 --requests 32 \
    --warmup 2 --prompt $LONG_PROMPT --shared 0 --output 128 --concurrency 8 >> $OUT/$1_long.jsonl 2>> $OUT/$1_bench.log
}

# kern: no flags. The load builds the cubins and captures every decode graph before it listens.
T0=$(date +%s.%N)
python3 -m kern.cli serve $CKPT --port 8100 $KERN_FLAGS > $OUT/kern_serve.log 2>&1 &
KERN=$!
if up http://127.0.0.1:8100 ${KERN_UP_S:-130} $KERN; then
  echo "{\"label\": \"kern\", \"startup_s\": $(python3 -c "import time; print(round(time.time() - $T0, 1))")}" \
    | tee $OUT/kern_startup.json
  nvidia-smi --query-gpu=memory.used --format=csv,noheader > $OUT/kern_memory.txt
  measure kern http://127.0.0.1:8100
  python3 -c "import urllib.request; print(urllib.request.urlopen('http://127.0.0.1:8100/metrics').read().decode())" \
    > $OUT/kern_metrics.txt
else
  echo "kern serve did not come up"; tr '\r' '\n' < $OUT/kern_serve.log | tail -15
fi
stop $KERN
tr '\r' '\n' < $OUT/kern_serve.log | grep -v "capturing decode graphs" | tail -8

if [ "$PEER" = vllm ]; then
  for _ in $(seq 1 120); do [ -f /tmp/vsite.ok ] && break; sleep 1; done
  T0=$(date +%s.%N)
  PYTHONPATH=/tmp/vsite HF_HUB_OFFLINE=1 python3 -m vllm.entrypoints.openai.api_server --model $CKPT --port 8102 \
    --max-model-len $((LONG_PROMPT + 256)) > $OUT/vllm_serve.log 2>&1 &
  PID=$!
  served vllm http://127.0.0.1:8102 ${VLLM_UP_S:-300} $PID $T0 $OUT $OUT/vllm_serve.log
  stop $PID
elif [ "$PEER" = transformers ]; then
  # transformers serve: /v1/models fails unless the hub cache folder exists (LESSONS.md, Serving).
  mkdir -p ~/.cache/huggingface/hub
  HF_HUB_OFFLINE=1 transformers serve --continuous-batching --cb-use-cuda-graph $CKPT --port 8101 \
    > $OUT/transformers_serve.log 2>&1 &
  PID=$!
  if up http://127.0.0.1:8101 ${HF_UP_S:-80} $PID; then
    CONC=32,128 LONG_PROMPT=0 LONE=0 measure transformers http://127.0.0.1:8101
  else
    echo "transformers serve did not come up"; tail -15 $OUT/transformers_serve.log
  fi
  stop $PID
fi

# STEPS=1: where the served steps' time goes, offline (bench/serve_steps.py), run-ahead 1 against the default
[ "${STEPS:-0}" = 1 ] && timeout ${STEPS_S:-120} python3 bench/serve_steps.py $CKPT --run-ahead 1,8 > $OUT/steps.jsonl 2>&1

python3 bench/serve_summary.py $OUT | tee $OUT/summary.json
# what comes back is at most 8 files: the logs travel as one archive
# (serve.log is bench/gpu.py's own log of this step: it stays)
LOGS=$(cd $OUT && ls *.log *.txt *.jsonl *_startup.json 2>/dev/null | grep -vx serve.log)
tar czf $OUT/logs.tgz -C $OUT $LOGS && (cd $OUT && rm -f $LOGS)
