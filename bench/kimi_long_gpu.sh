# Issue 38 on one GPU: the long-context case Kimi-Linear exists for, kern serve (no flags) and
# then vLLM 0.26 (--max-model-len 132,096) on the same seeded random checkpoint (the
# Kimi-Linear-48B-A3B shape at 8 layers, config.json saying 132,096 positions), each alone on the
# GPU: 8 streams of 32,768-token prompts, then one of 131,072, 64 out (bench/kimi_long.py: TTFT,
# output tok/s, decode tok/s, the state memory a sequence holds, measured and computed); with
# SERVE_STREAMS=32,128 the serve workload on the same servers after them (one start-up each).
# Run from the repository root with OUT set; results under $OUT: long_kern*.json, long_vllm.json,
# long_summary.{txt,json}, the servers' logs (and the kern phase's options' files, below).
#
# Options of the kern phase: STEPS="0 8192" kern serve at its default step and with
# --step-tokens 8192, one after the other (long_kern.json, long_kern-s8192.json); PROBE=1 times
# kda_tc's launch alone first (kda_tc.json); PROFILE=1 prices a long prompt's step op by op after
# the servers (kern bench, bench/kimi_long_step.toml: long_step_bench.{txt,json}).
#
# One device call is at most 600 s and vLLM's wheels come in eight parts (vp1..vp8 of 46 MB, a call
# each, `bash bench/wheels.sh vllm`; a call's carry with the tree is at most 64 MiB), so kern runs
# in the background while the parts are copied. On an 80 GB H100 give the vllm phase VLLM_MEM=0.85
# (--gpu-memory-utilization; 0.9 leaves vLLM's profiling too little). The 2026-12-06 H100 recipe:
#   1. carry [".whl"]: `mkdir -p /tmp/longtree && cp -a $(ls -A | grep -v '^vp') /tmp/longtree/ &&
#      cd /tmp/longtree && (PHASE=kern PROBE=1 PROFILE=1 STEPS="0 8192" SERVE_STREAMS=32,128 setsid
#      nohup bash bench/kimi_long_gpu.sh > /tmp/long-kern.out 2>&1 < /dev/null &)` (returns at
#      once). In the background: the carried wheels and kern installed (~20 s), the checkpoint
#      made on the GPU and saved to /tmp/kimi/ckpt-long (~150 s, 47 s of it the write), then each
#      kern serve: up in ~32 s, an untimed 8,192-token request, the cases (2026-12-06, main before
#      the kda_tc changes: 8 x 32,768 in ~8 s, 131,072 in ~6 s), the serve workload.
#   2-9. carry ["vpN"] (N = 1..8): `mkdir -p /tmp/vw && cp vpN/* /tmp/vw/`; in the 8th, after the
#      copy: `cd /tmp/longtree && PHASE=wheels bash bench/kimi_long_gpu.sh` (join and install,
#      ~15 s; the GPU is kern's meanwhile, this is CPU and disk)
#   10. `cd /tmp/longtree && WAIT_S=... PHASE=wait bash bench/kimi_long_gpu.sh`: waits for the kern
#      phase (at most WAIT_S, default 580) and brings its results back
#   11. `cd /tmp/longtree && VLLM_MEM=0.85 SERVE_STREAMS=32,128 PHASE=vllm bash bench/kimi_long_gpu.sh`:
#      kern's results (waiting at most WAIT_S=20 more), then vLLM started by kimi_long.py (up in
#      286.5 s on the H100 of 2026-12-06; UP_S=420 bounds it), the same requests, the table
# Where a warm machine already holds vLLM's wheels (/tmp/vsite.ok), calls 2-10 go: call 1's
# command in the foreground, then call 11.
# A dry run on a laptop (the tiny shape on the CPU, no vLLM):
#   OUT=/tmp/o DRY=1 PHASE=kern PROFILE=1 STEPS="0 512" SERVE_STREAMS=4 bash bench/kimi_long_gpu.sh
: "${OUT:?set OUT (the device tool sets it)}"
PHASE=${PHASE:?PHASE=kern|wheels|wait|vllm}
BG=/tmp/long-bg  # the kern phase's results and its done mark, outliving the call that started it
CKPT=${CKPT:-/tmp/kimi/ckpt}  # served as $CKPT-long (bench/kimi_long.py makes or links it)
# SERVE_STREAMS=32,128: the serve workload too, on each server after the long cases (one start-up each)
LONG="python3 bench/kimi_long.py $CKPT ${SERVE_STREAMS:+--serve-streams $SERVE_STREAMS}"
TARGET=cuda STEP_TOML=bench/kimi_long_step.toml
[ "${DRY:-0}" = 1 ] && { TARGET=cpu STEP_TOML=/tmp/kimi-dry/step.toml; mkdir -p /tmp/kimi-dry
  printf 'samples = 2\n[[sweep]]\ngroups = [1]\nrows = [256]\ncontext = [0, 1024]\n' > $STEP_TOML
  CKPT=/tmp/kimi-dry/ckpt; LONG="python3 bench/kimi_long.py $CKPT --shape tiny --layers 4 \
  --device cpu --target cpu --positions 8192 --cases 2x1500,1x3000 --output 16 --warm-prompt 256 ${SERVE_STREAMS:+--serve-streams $SERVE_STREAMS}"; }
bring() { cp $BG/long_kern* $BG/kda_tc* $BG/long_step* $OUT/ 2> /dev/null; tail -3 $BG/kern.out 2> /dev/null; }

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
  # PROFILE=1: where a long prompt's step goes, op by op (kern bench, bench/kimi_long_step.toml) on
  # the default deployment kern serve used, after the servers stopped
  if [ "${PROFILE:-0}" = 1 ]; then
    M=$(python3 -c "from pathlib import Path; from kern.deployments import deployment_for; \
print(deployment_for(Path('$CKPT-long'), '$TARGET'))")
    timeout ${PROFILE_S:-240} python3 -m kern.cli bench $M --workload $STEP_TOML --weights $CKPT-long \
      --json $BG/long_step_bench.json > $BG/long_step_bench.txt 2>&1
  fi
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
