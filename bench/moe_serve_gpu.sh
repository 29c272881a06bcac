# A mixture-of-experts family on one H200 beside vLLM 0.26 on the same checkpoint, in back-to-back
# device calls of one warm machine (the checkpoint, the vLLM install and the vLLM server live in
# /tmp between them). Run from the repository root; every figure and log comes back
# under $OUT ($PHASE.tgz, and the summaries beside it).
#
#   FAMILY=moe  (the default) Qwen3-MoE: bench/moe_gpu.py, the Qwen3-30B-A3B shape at 24 layers
#   FAMILY=kimi Kimi-Linear: bench/kimi_gpu.py, the Kimi-Linear-48B-A3B shape at 8 layers (its
#               ckpt step's config.json carries the published fields vLLM's own config reads)
#               (its long-context case, 131,072-token prompts beside vLLM: bench/kimi_long_gpu.sh)
#
#   PHASE=bg    (the first call, launched with setsid so it outlives the call while the vLLM wheel
#               parts are copied in the next ones) the family script's ckpt and kern steps ($BG_STEPS):
#               the seeded random checkpoint at $LAYERS layers, transformers'
#               bf16 and fp32 logits, kern's teacher-forced parity and offline decode; logs in /tmp/$FAMILY-bg
#               SERVE_IN_BG=1: then kern serve measured over HTTP as in PHASE=kern (the GPU is idle
#               while the wheel parts are copied), its figures gathered by PHASE=vllm
#   PHASE=wheels  (the call that copies the last part) join and install vLLM's wheels, in the background;
#               START_VLLM=1: then vLLM's server started as soon as the bg phase is done
#   PHASE=kern  the bg phase's results into $OUT; the kern step again in a quiet machine (parity,
#               offline decode at batch 1/16/64; KERN_S=0 leaves it out); kern serve with no flags
#               over HTTP; then vLLM's server started (setsid) for the next call
#   PHASE=vllm  the same HTTP measurements on vLLM's server, then the summary (SERVE_IN_BG=1: with
#               the bg phase's results and kern's figures)
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
#      bench/moe_serve_gpu.sh > /tmp/bg.out 2>&1 < /dev/null &)` (every call of a FAMILY=kimi run
#      sets FAMILY=kimi likewise)
#   2-7. carry [vpN]: `mkdir -p /tmp/vw && cp vpN/* /tmp/vw/` (the last also starts PHASE=wheels
#      from /tmp/moetree the same way)
#   8. carry [.dev/moe, .whl]: the wheels into /tmp/site, `cp -r .whl .dev/moe/ && cd .dev/moe &&
#      pip install --no-deps --no-build-isolation -e .`, PYTHONPATH=/tmp/site, then PHASE=kern
#   9. carry [.dev/moe]: `cd .dev/moe && PHASE=vllm bash bench/moe_serve_gpu.sh`
#
# Kimi-Linear on 2026-12-01 (FAMILY=kimi, every call): kern serve in the bg phase and vLLM started
# by the wheels phase, so that the GPU works while the parts are copied (745 s of device time in
# all, a cold start and vLLM's 256 s start-up in it):
#   1. carry [.dev/kimi, .whl, vp7] (vp1 and the tree pass the 64 MiB a call carries): vp7 into
#      /tmp/vw, the tree into /tmp/kimitree with .whl, the wheels into /tmp/site,
#      PYTHONPATH=/tmp/site:/tmp/kimitree/src:<a folder whose kern_models links to
#      /tmp/kimitree/models> (another tree's editable install on the machine cannot shadow it),
#      then `PHASE=bg SERVE_IN_BG=1 BG_STEPS=ckpt,parity,decode,profile` (setsid, as above)
#   2-7. carry [vp1] .. [vp6]: into /tmp/vw (the last also starts `PHASE=wheels START_VLLM=1` the same way)
#   8. wait for /tmp/kimi-bg/done in the call (the machine stays warm), its summary into $OUT
#   9. `cd /tmp/kimitree && FAMILY=kimi SERVE_IN_BG=1 PHASE=vllm bash bench/moe_serve_gpu.sh` (same PYTHONPATH)
#
# On 2026-12-04 (FAMILY=moe, 24 layers, ~480 s of device time): the parts cut at 52 MB (the tree,
# ~11 MB, travels with each), the tree copied on the device instead of carried twice:
#   1. carry [.whl, vp7]: `mkdir -p /tmp/vw && cp vp7/* /tmp/vw/ && mkdir /tmp/moetree && cp -a
#      $(ls -A | grep -v '^vp') /tmp/moetree/ && cd /tmp/moetree && source bench/device_env.sh &&
#      (PHASE=bg SERVE_IN_BG=1 BG_STEPS=ckpt,kern setsid nohup bash bench/moe_serve_gpu.sh ... &)`
#   2-7. carry [vpN]: into /tmp/vw (the last also starts `PHASE=wheels START_VLLM=1` from /tmp/moetree)
#   8. from /tmp/moetree, device_env's exports by hand (PYTHONPATH=/tmp/kern-install:/tmp/site ...):
#      `SERVE_IN_BG=1 BG_WAIT_S=480 VLLM_UP_S=480 PHASE=vllm bash bench/moe_serve_gpu.sh` in the
#      background, the call waiting on it and packing what is there if it runs long
# On 2026-12-06 (FAMILY=kimi, one H100 80 GB: no H200 came), after the GPU suite on the same machine
# (the checkpoint made by `python3 bench/kimi_gpu.py --layers 8 --steps ckpt,decode,profile,serve`
# in the call before, /tmp/kimi/ckpt): `bash bench/wheels.sh vllm` here first (46 MB parts: the
# shared tool's 62 MiB ones pass the 64 MiB a call carries with the tree), then
#   1-7. carry [vpN]: into /tmp/vw
#   8. carry [vp8]: source bench/device_env.sh, `FAMILY=kimi PHASE=wheels`, then
#      `touch /tmp/kimi-bg/done; KERN_S=0 VLLM=1 VLLM_MEM=0.85 PHASE=kern`, then `PHASE=vllm`
#      (kern serve measured, then vLLM started and measured: ~235 s)
# A dry run on a laptop: SHAPE=tiny DEVICE=cpu TARGET=cpu LAYERS=3 BATCH=1,2 VOCAB=256 REQUESTS=8 DECODE_OUT=16
# KERN_FLAGS='--target cpu' VLLM=0 PHASE=bg, then PHASE=kern (FAMILY=kimi: LAYERS=4 BG_STEPS=ckpt,kern).
: "${OUT:?set OUT (the device tool sets it)}"
PHASE=${PHASE:?PHASE=bg|wheels|kern|vllm}
FAMILY=${FAMILY:-moe}
# the family's one-call script, its real model's shape, depth and vocabulary, and its ports (kern's,
# vLLM's) and files in /tmp, apart from another family's run on the same machine
case $FAMILY in
moe) SCRIPT=bench/moe_gpu.py; SHAPE=${SHAPE:-qwen3-30b-a3b}; LAYERS=${LAYERS:-24}; VOCAB=${VOCAB:-151936}; PORT=8100 ;;
kimi) SCRIPT=bench/kimi_gpu.py; SHAPE=${SHAPE:-kimi-linear-48b-a3b}; LAYERS=${LAYERS:-8}; VOCAB=${VOCAB:-163840}; PORT=8110 ;;
*) echo "FAMILY=$FAMILY: moe or kimi"; exit 2 ;;
esac
DEVICE=${DEVICE:-cuda}
TARGET=${TARGET:-cuda}
BATCH=${BATCH:-1,16,64}
BG=/tmp/$FAMILY-bg
export ${FAMILY^^}_WORK=/tmp/$FAMILY  # where the family script keeps its checkpoint (bench/gpu.py family_setup)
CKPT=/tmp/$FAMILY/ckpt
DECODE="--prompt 32 --shared 0 --output ${DECODE_OUT:-256} --warmup 2 --vocab $VOCAB"
WORK="--prompt 512 --shared 256 --output 128 --requests ${REQUESTS:-256} --vocab $VOCAB"
R=/tmp/res-$FAMILY-$PHASE  # what the phase writes, packed into $OUT/$PHASE.tgz at its end (8 files come back)
rm -rf $R && mkdir -p $R
pack() { python3 bench/moe_serve_summary.py $R | tee $R/moe_serve_summary.txt; cp $R/*summary* $OUT/ 2> /dev/null
         tar czf $OUT/$PHASE.tgz -C $R .; }
FAM="python3 $SCRIPT --layers $LAYERS --shape $SHAPE --device $DEVICE --target $TARGET --batch $BATCH"

. bench/servers.sh  # up, stop, served

measure() {  # $1 label, $2 url: decode at 1/16/64 streams, then serving at 32 and 128 (JSON lines)
  nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv > $R/$1_gpu_apps.txt 2>&1
  for c in 1 16 64; do  # the first run's warm-up is a server's first requests: vLLM autotunes its
    # Triton kernels there (flash-linear-attention's KDA: past a minute on 2026-12-06, no line came)
    timeout $([ $c = 1 ] && echo 300 || echo 60) python3 bench/serve.py --url $2 --label $1 $DECODE --requests $c --concurrency $c \
      >> $R/$1_decode.jsonl 2>> $R/$1_bench.log
  done
  for c in 32 128; do
    timeout 90 python3 bench/serve.py --url $2 --label $1 $WORK --concurrency $c --warmup 4 \
      >> $R/$1_serve.jsonl 2>> $R/$1_bench.log
  done
}

kern_serve() {  # kern serve with no flags over HTTP, measured, stopped
  python3 bench/serve.py --prepare $CKPT
  T0=$(date +%s.%N)
  python3 -m kern.cli serve $CKPT --port $PORT ${KERN_FLAGS:-} > $R/kern_serve.log 2>&1 &
  KERN=$!
  served kern http://127.0.0.1:$PORT ${KERN_UP_S:-150} $KERN $T0 $R $R/kern_serve.log
  stop $KERN
}

gather_bg() {  # the bg phase's results (waiting for its end at most BG_WAIT_S) into $R and $OUT
  for _ in $(seq 1 ${BG_WAIT_S:-240}); do [ -f $BG/done ] && break; sleep 1; done
  [ -f $BG/done ] || echo "the bg phase has not finished: its logs as they stand"
  mkdir -p $R/bg && cp $BG/summary.* $BG/*.log $BG/family_gpu.out $R/bg/ 2> /dev/null; cp $BG/summary.txt $OUT/bg_summary.txt
  cp /tmp/res-$FAMILY-bg/kern_* $R/ 2> /dev/null  # kern serve's, where the bg phase served (SERVE_IN_BG=1)
  cat $BG/summary.txt 2> /dev/null
}

start_vllm() {  # vLLM's server (setsid: it outlives this call) once its wheels are installed
  for _ in $(seq 1 120); do [ -f /tmp/vsite.ok ] && break; sleep 1; done
  [ -f /tmp/vsite.ok ] || { echo "vLLM's wheels are not installed"; tail -5 /tmp/vllm_install.log; exit 1; }
  date +%s.%N > /tmp/vllm-$FAMILY.t0
  # from /tmp: the next call replaces this working tree, and a server whose working directory
  # is gone dies at its first Path.resolve (transformers' import does one)
  # (expandable segments: on an 80 GB H100 vLLM's MLA profiling asks for one 29.5 GiB block that
  # its allocator's fragments cannot give, and it does not start; VLLM_MEM there: 0.85)
  ( cd /tmp && PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True PYTHONPATH=/tmp/vsite HF_HUB_OFFLINE=1 setsid nohup \
    python3 -m vllm.entrypoints.openai.api_server --model $CKPT --port $((PORT + 2)) --max-model-len 2048 \
    --gpu-memory-utilization ${VLLM_MEM:-0.5} > /tmp/vllm_serve-$FAMILY.log \
    2>&1 < /dev/null & echo $! > /tmp/vllm-$FAMILY.pid )
}

case $PHASE in
bg)
  rm -rf $BG /tmp/vllm-$FAMILY.pid /tmp/vllm-$FAMILY.t0 && mkdir -p $BG
  OUT=$BG $FAM --steps ${BG_STEPS:-ckpt,kern} --ckpt-timeout 400 --kern-timeout 300 > $BG/family_gpu.out 2>&1
  [ "${SERVE_IN_BG:-0}" = 0 ] || [ ! -f $CKPT/config.json ] || kern_serve > $BG/kern_serve.out 2>&1
  touch $BG/done
  ;;
wheels)
  ( cat /tmp/vw/p_* > /tmp/vw.tar && mkdir -p /tmp/vwh && tar xf /tmp/vw.tar -C /tmp/vwh && rm /tmp/vw.tar \
    && python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/vsite /tmp/vwh/*.whl \
    && touch /tmp/vsite.ok ) > /tmp/vllm_install.log 2>&1
  if [ "${START_VLLM:-0}" = 1 ]; then  # the GPU is vLLM's once the bg phase (kern serve too) is done
    for _ in $(seq 1 600); do [ -f $BG/done ] && break; sleep 1; done
    [ -f $CKPT/config.json ] && start_vllm
  fi
  ;;
kern)
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee $R/gpu.txt
  gather_bg
  [ -f $CKPT/config.json ] || { echo "no checkpoint"; tail -20 $BG/family_gpu.out $BG/ckpt.log; exit 1; }
  [ "${KERN_S:-200}" = 0 ] || OUT=$R $FAM --steps kern --kern-timeout ${KERN_S:-200}
  kern_serve
  pack
  [ "${VLLM:-1}" = 1 ] || exit 0
  start_vllm
  ;;
vllm)
  [ "${SERVE_IN_BG:-0}" = 0 ] || gather_bg
  for _ in $(seq 1 ${VLLM_UP_S:-400}); do [ -f /tmp/vllm-$FAMILY.pid ] && break; sleep 1; done
  PID=$(cat /tmp/vllm-$FAMILY.pid)
  served vllm http://127.0.0.1:$((PORT + 2)) ${VLLM_UP_S:-400} $PID $(cat /tmp/vllm-$FAMILY.t0) $R /tmp/vllm_serve-$FAMILY.log
  stop $PID
  cp /tmp/vllm_serve-$FAMILY.log $R/vllm_serve.log
  pack
  ;;
esac
