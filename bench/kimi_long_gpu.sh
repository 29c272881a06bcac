# Issue 38, item 3 on one H200: the long-context case Kimi-Linear exists for, kern serve (no
# flags) and then vLLM 0.26 (--max-model-len 132,096) on the same seeded random checkpoint (the
# Kimi-Linear-48B-A3B shape at 8 layers, config.json saying 132,096 positions), each alone on the
# GPU: 8 streams of 32,768-token prompts, then one of 131,072, 64 out (bench/kimi_long.py: TTFT,
# output tok/s, decode tok/s, the state memory a sequence holds, measured and computed).
# Run from the repository root with OUT set; results under $OUT: long_kern.json, long_vllm.json,
# long_summary.{txt,json}, the servers' logs.
#
# One device call is at most 600 s and vLLM's wheels come in eight parts (vp1..vp8 of 46 MB, a call
# each, `bash bench/wheels.sh vllm`), so kern runs in the background while the parts are copied.
# On an 80 GB H100 add VLLM_MEM=0.85 to the vllm phase (--gpu-memory-utilization; 0.9 leaves vLLM's
# profiling too little):
#   1. carry [".whl", "vp8"]: `mkdir -p /tmp/vw && cp vp8/* /tmp/vw/ && mkdir -p /tmp/longtree &&
#      cp -a $(ls -A | grep -v '^vp') /tmp/longtree/ && cd /tmp/longtree &&
#      (PHASE=kern setsid nohup bash bench/kimi_long_gpu.sh > /tmp/long-kern.out 2>&1 < /dev/null &)`
#      (returns at once). In the background, ~450-600 s (estimates, nothing here is measured yet):
#      the carried wheels and kern installed (~20 s), the checkpoint made on the GPU and saved to
#      /tmp/kimi/ckpt-long (~100 s; linked instead to /tmp/kimi/ckpt's weights where an earlier
#      FAMILY=kimi run left them: seconds), kern serve up (~40 s: the deployment, the weights, the
#      decode graphs at 13 reach buckets up to 132,096), an untimed 8,192-token request, then
#      8 x 32,768 and 1 x 131,072. kern's prompt tokens attend in MLA's expanded form
#      (mla_attend_x on mma.sync, docs/hybrid.md; written 2026-12-06, not yet timed on a GPU): a
#      131,072-token prompt is ~0.35 PFLOP of attention (131,072^2 / 2 pairs x 32 heads x 2
#      layers x 2 x (192 + 128)), ~2-3 s at the ~150 TFLOP/s llama's mma.sync attention reaches,
#      plus its keys expanded again each 2,048-row step (~0.07 PFLOP through the GEMM);
#      --case-s 600 bounds each.
#   2-8. carry ["vpN"] (N = 1..7): `mkdir -p /tmp/vw && cp vpN/* /tmp/vw/`; in the 8th, after the
#      copy: `cd /tmp/longtree && PHASE=wheels bash bench/kimi_long_gpu.sh` (join and install,
#      ~60 s; the GPU is kern's meanwhile, this is CPU and disk)
#   9. `cd /tmp/longtree && PHASE=wait bash bench/kimi_long_gpu.sh` where the kern phase may not
#      be done: waits for it (at most WAIT_S, default 580) and brings its results back
#   10. `cd /tmp/longtree && PHASE=vllm bash bench/kimi_long_gpu.sh`: kern's results (waiting at
#      most WAIT_S=20 more), then vLLM started by kimi_long.py (its start-up ~250 s as on
#      2026-12-01, UP_S=420 bounds it), the same requests (~60 s), the table: ~350 s
# Where a warm machine already holds vLLM's wheels (/tmp/vsite.ok), calls 2-9 go: call 1's
# command in the foreground with PHASE=kern (then the call is ~500 s), then call 10.
# STEPS="0 8192" (the kern phase): kern serve at its default step and with --step-tokens 8192,
# each alone (~60 s more each at these cases on the H100 of 2026-12-06).
# A dry run on a laptop (the tiny shape on the CPU, no vLLM): OUT=/tmp/o DRY=1 PHASE=kern bash bench/kimi_long_gpu.sh
: "${OUT:?set OUT (the device tool sets it)}"
PHASE=${PHASE:?PHASE=kern|wheels|wait|vllm}
BG=/tmp/long-bg  # the kern phase's results and its done mark, outliving the call that started it
CKPT=${CKPT:-/tmp/kimi/ckpt}  # served as $CKPT-long (bench/kimi_long.py makes or links it)
# SERVE_STREAMS=32,128: the serve workload too, on each server after the long cases (one start-up each)
LONG="python3 bench/kimi_long.py $CKPT ${SERVE_STREAMS:+--serve-streams $SERVE_STREAMS}"
[ "${DRY:-0}" = 1 ] && { CKPT=/tmp/kimi-dry/ckpt; LONG="python3 bench/kimi_long.py $CKPT --shape tiny --layers 4 \
  --device cpu --target cpu --positions 8192 --cases 2x1500,1x3000 --output 16 --warm-prompt 256"; }
bring() { cp $BG/long_kern* $BG/kda_tc* $OUT/ 2> /dev/null; tail -3 $BG/kern.out 2> /dev/null; }

case $PHASE in
kern)
  rm -rf $BG && mkdir -p $BG
  [ "${DRY:-0}" = 1 ] || OUT=$BG . bench/device_env.sh  # the carried wheels into /tmp/site, kern installed from this tree
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader > $BG/gpu.txt 2>&1
  # PROBE=1: KDA's recurrence launch alone first (bench/probes/kda_tc.py, ~1 min), into $BG/kda_tc.json
  [ "${PROBE:-0}" = 1 ] && OUT=$BG timeout 180 python3 -m bench.probes.kda_tc > $BG/kda_tc_probe.txt 2>&1
  # STEPS="2048 8192": kern at each --step-tokens too (0: the default), one server after another
  for st in ${STEPS:-0}; do
    $LONG --server kern --out $BG --case-s ${CASE_S:-600} --up-s ${UP_S:-300} \
      $([ "$st" = 0 ] || echo --step-tokens $st) >> $BG/kern.out 2>&1
  done
  touch $BG/done
  bring
  ;;
wheels)
  ( cat /tmp/vw/p_* > /tmp/vw.tar && mkdir -p /tmp/vwh && tar xf /tmp/vw.tar -C /tmp/vwh && rm /tmp/vw.tar \
    && python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/vsite /tmp/vwh/*.whl \
    && touch /tmp/vsite.ok ) > $OUT/vllm_install.log 2>&1
  tail -3 $OUT/vllm_install.log; ls /tmp/vsite.ok
  ;;
wait|vllm)
  for _ in $(seq 1 ${WAIT_S:-$([ $PHASE = wait ] && echo 580 || echo 20)}); do [ -f $BG/done ] && break; sleep 1; done
  [ -f $BG/done ] || echo "the kern phase has not finished: its results as they stand"
  bring
  [ $PHASE = wait ] && exit 0
  [ -f /tmp/vsite.ok ] || { echo "vLLM's wheels are not installed (PHASE=wheels)"; exit 1; }
  export PYTHONPATH="/tmp/kern-install:/tmp/site" PYTHONUNBUFFERED=1 KERN_CACHE=/tmp/kern-cache  # device_env's
  # vLLM alone on the GPU: the kern phase's server is stopped before its done mark
  $LONG --server vllm --out $OUT --vllm-site /tmp/vsite --vllm-util ${VLLM_MEM:-0.9} --up-s ${UP_S:-420} --case-s ${CASE_S:-120} \
    --deadline-s ${VLLM_S:-540} 2>&1 | tail -4
  python3 bench/kimi_long.py --table $OUT
  ;;
esac
