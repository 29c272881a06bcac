# Qwen3-MoE on one H200 beside vLLM 0.26 on the same checkpoint, in back-to-back device calls of
# one warm machine (the checkpoint, the vLLM install and the vLLM server live in /tmp between
# them). Run from the repository root; every figure and log comes back
# under $OUT ($PHASE.tgz, and the summaries beside it).
#
#   PHASE=bg    (the first call, launched with setsid so it outlives the call while the vLLM wheel
#               parts are copied in the next ones) bench/moe_gpu.py's ckpt and kern steps:
#               the seeded random Qwen3-30B-A3B-shaped checkpoint at $LAYERS layers, transformers'
#               bf16 and fp32 logits, kern's teacher-forced parity and offline decode; logs in /tmp/moe-bg
#   PHASE=wheels  (the call that copies the last part) join and install vLLM's wheels, in the background
#   PHASE=kern  the bg phase's results into $OUT; the kern step again in a quiet machine (parity,
#               offline decode at batch 1/16/64); kern serve with no flags over HTTP; then vLLM's
#               server started (setsid) for the next call
#   PHASE=vllm  the same HTTP measurements on vLLM's server, then the summary
#
# The HTTP measurements (bench/serve.py), the same on both servers:
#   decode   32-token prompts, 256 out, all streams at once, concurrency 1 / 16 / 64: the decode rate
#            is concurrency / TPOT (vLLM's decode figures come from its server, not offline)
#   serving  the serve benchmark's workload: 512-token prompts sharing a 256-token system prompt,
#            128 out, 256 requests at concurrency 32 and 128
# vLLM runs with its defaults but `--max-model-len 2048` and `--gpu-memory-utilization 0.5` (70 GB:
# the weights and ~35 GB of KV cache, ~17x what concurrency 128 needs; it starts only on that much
# free memory).
#
# As run on 2026-12-01 (docs/perf-history.md), the tree copied to .dev/moe and each call fired as
# soon as the last returned:
#   1. carry [.dev/moe, .whl, vp7]: `mkdir -p /tmp/vw && cp vp7/* /tmp/vw/ && cp -r .dev/moe /tmp/moetree
#      && cp -r .whl /tmp/moetree/.whl && cd /tmp/moetree && (PHASE=bg setsid nohup bash
#      bench/moe_serve_gpu.sh > /tmp/bg.out 2>&1 < /dev/null &)`
#   2-7. carry [vpN]: `mkdir -p /tmp/vw && cp vpN/* /tmp/vw/` (the last also starts PHASE=wheels
#      from /tmp/moetree the same way)
#   8. carry [.dev/moe, .whl]: the wheels into /tmp/site, `cp -r .whl .dev/moe/ && cd .dev/moe &&
#      pip install --no-deps --no-build-isolation -e .`, PYTHONPATH=/tmp/site, then PHASE=kern
#   9. carry [.dev/moe]: `cd .dev/moe && PHASE=vllm bash bench/moe_serve_gpu.sh`
#
# A dry run on a laptop: SHAPE=tiny DEVICE=cpu TARGET=cpu LAYERS=3 BATCH=1,2 VOCAB=256 REQUESTS=8 DECODE_OUT=16
# KERN_FLAGS='--target cpu' VLLM=0 PHASE=bg, then PHASE=kern.
: "${OUT:?set OUT (the device tool sets it)}"
PHASE=${PHASE:?PHASE=bg|wheels|kern|vllm}
LAYERS=${LAYERS:-24}
SHAPE=${SHAPE:-qwen3-30b-a3b}
DEVICE=${DEVICE:-cuda}
TARGET=${TARGET:-cuda}
BATCH=${BATCH:-1,16,64}
BG=/tmp/moe-bg
export MOE_WORK=/tmp/moe
CKPT=$MOE_WORK/ckpt
VOCAB=${VOCAB:-151936}
DECODE="--prompt 32 --shared 0 --output ${DECODE_OUT:-256} --warmup 2 --vocab $VOCAB"
WORK="--prompt 512 --shared 256 --output 128 --requests ${REQUESTS:-256} --vocab $VOCAB"
R=/tmp/res-$PHASE  # what the phase writes, packed into $OUT/$PHASE.tgz at its end (8 files come back)
rm -rf $R && mkdir -p $R
pack() { python3 bench/moe_serve_summary.py $R | tee $R/moe_serve_summary.txt; cp $R/*summary* $OUT/ 2> /dev/null
         tar czf $OUT/$PHASE.tgz -C $R .; }
MOE="python3 bench/moe_gpu.py --layers $LAYERS --shape $SHAPE --device $DEVICE --target $TARGET --batch $BATCH"

. bench/servers.sh  # up, stop, served

measure() {  # $1 label, $2 url: decode at 1/16/64 streams, then serving at 32 and 128 (JSON lines)
  for c in 1 16 64; do
    timeout 60 python3 bench/serve.py --url $2 --label $1 $DECODE --requests $c --concurrency $c \
      >> $R/$1_decode.jsonl 2>> $R/$1_bench.log
  done
  for c in 32 128; do
    timeout 90 python3 bench/serve.py --url $2 --label $1 $WORK --concurrency $c --warmup 4 \
      >> $R/$1_serve.jsonl 2>> $R/$1_bench.log
  done
}

case $PHASE in
bg)
  rm -rf $BG && mkdir -p $BG
  OUT=$BG $MOE --steps ckpt,kern --ckpt-timeout 400 --kern-timeout 300 > $BG/moe_gpu.out 2>&1
  touch $BG/done
  ;;
wheels)
  ( cat /tmp/vw/p_* > /tmp/vw.tar && mkdir -p /tmp/vwh && tar xf /tmp/vw.tar -C /tmp/vwh && rm /tmp/vw.tar \
    && python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/vsite /tmp/vwh/*.whl \
    && touch /tmp/vsite.ok ) > /tmp/vllm_install.log 2>&1
  ;;
kern)
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee $R/gpu.txt
  for _ in $(seq 1 ${BG_WAIT_S:-240}); do [ -f $BG/done ] && break; sleep 1; done
  [ -f $BG/done ] || echo "the bg phase has not finished: its logs as they stand"
  mkdir -p $R/bg && cp $BG/summary.* $BG/*.log $BG/moe_gpu.out $R/bg/ 2> /dev/null; cp $BG/summary.txt $OUT/bg_summary.txt
  cat $BG/summary.txt 2> /dev/null
  [ -f $CKPT/config.json ] || { echo "no checkpoint"; tail -20 $BG/moe_gpu.out $BG/ckpt.log; exit 1; }
  OUT=$R $MOE --steps kern --kern-timeout ${KERN_S:-200}
  python3 bench/serve.py --prepare $CKPT
  T0=$(date +%s.%N)
  python3 -m kern.cli serve $CKPT --port 8100 ${KERN_FLAGS:-} > $R/kern_serve.log 2>&1 &
  KERN=$!
  served kern http://127.0.0.1:8100 ${KERN_UP_S:-150} $KERN $T0 $R $R/kern_serve.log
  stop $KERN
  pack
  [ "${VLLM:-1}" = 1 ] || exit 0
  for _ in $(seq 1 120); do [ -f /tmp/vsite.ok ] && break; sleep 1; done
  [ -f /tmp/vsite.ok ] || { echo "vLLM's wheels are not installed"; tail -5 /tmp/vllm_install.log; exit 1; }
  date +%s.%N > /tmp/vllm.t0
  # from /tmp: the next call replaces this working tree, and a server whose working directory
  # is gone dies at its first Path.resolve (transformers' import does one)
  ( cd /tmp && PYTHONPATH=/tmp/vsite HF_HUB_OFFLINE=1 setsid nohup python3 -m vllm.entrypoints.openai.api_server \
    --model $CKPT --port 8102 --max-model-len 2048 --gpu-memory-utilization 0.5 > /tmp/vllm_serve.log 2>&1 \
    < /dev/null & echo $! > /tmp/vllm.pid )
  ;;
vllm)
  PID=$(cat /tmp/vllm.pid)
  served vllm http://127.0.0.1:8102 ${VLLM_UP_S:-400} $PID $(cat /tmp/vllm.t0) $R /tmp/vllm_serve.log
  stop $PID
  cp /tmp/vllm_serve.log $R/
  pack
  ;;
esac
