# Issue 41 on two H200s (nvidia-h200-x2), every figure in one warm machine's calls: serving across
# the GPUs beside its peer on the same checkpoint, back to back, each server alone on the GPUs,
# and bench/multi_gpu.py's steps on the same checkpoints.
#
#   serve_tp  kern serve --tp 2 --memory $MEMORY, seeded random Llama-3.1-8B shape (config saying
#             131,072 positions), the serve workload (bench/serve.py: 512-token prompts sharing 256,
#             128 out, $REQUESTS requests) at each of $CONC streams (32, 128)
#   serve_ep  kern serve --ep 2 --memory $MEMORY, seeded random Qwen3-30B-A3B shape at $LAYERS (24)
#             layers, the same workload
#   vllm      vLLM 0.26 on the same two checkpoints: `--tensor-parallel-size 2` on the 8B and
#             `--tensor-parallel-size 2 --enable-expert-parallel` on the MoE (the flags of vLLM's
#             engine/arg_utils.py ParallelConfig group; EP's size is TP x DP = 2, its all-to-all
#             vLLM's default allgather_reducescatter), each with `--max-model-len 2048
#             --gpu-memory-utilization 0.1 --kv-cache-memory-bytes $VLLM_KV_GIB GiB` a GPU (fixed, so
#             that two servers may start together; ~3x what 128 streams hold), its other settings
#             its defaults (graphs, prefix caching, chunked prefill, async scheduling). VLLM_TOGETHER=1
#             (default): both start at once (their ~4-minute start-ups overlap), and once both are
#             up each is measured alone while the other idles (holding memory, no requests);
#             VLLM_TOGETHER=0: one started, measured and stopped, then the other (~250 s more)
#   tests, tp, ep, ep_bench, pp   bench/multi_gpu.py's steps (its docstring): the multi-GPU GPU
#             tests, TP=2 against TP=1 at batch 1 (bench/tp.py), EP=2 against EP=1 (tokens,
#             decode tok/s at 1/16/64) and the all-to-all's share of an EP=2 decode step from kern
#             bench, PP=2 against one GPU (tokens, decode steps, the host loop at 128 streams), on
#             this script's checkpoints (tp.py makes its own)
#   serve_pp  kern serve --pp 2 against kern serve on one GPU (GPU 0), both --memory $MEMORY, at
#             $PP_CONC (128) streams of the same workload
# kern's --memory: a split or pipelined deployment's default state memory is 512 MiB (one budget
# for every rank; docs/pipeline.md), which would hold ~12 of 128 streams of the 8B; 40G a GPU
# holds all of them several times over, and the one-GPU baseline gets the same.
#
# Why one background pipeline rather than a call each: vLLM's wheels come as seven parts, one
# call each (64 MiB a call), and the GPUs should work while they are copied; a call lasts 600 s
# at most and the pipeline ~25 minutes. So the first call starts PHASE=all in the background (it
# outlives the call), the parts' calls follow, and the last calls wait for the pipeline and bring
# its results back (PHASE=collect). Each kern server and its vLLM peer run in that one pipeline,
# minutes apart on the same warm machine and checkpoint, nothing else on the GPUs.
#
# Before the session, here: `bash bench/wheels.sh` (.whl), and vLLM 0.26's wheel set in parts of
# 52 MB vp1..vp7, the last (vp7, ~33 MB) the smallest (/work/shared/tools/vllm-peer-wheels.sh with
# `split -b 52m`; a call carries the ~12 MB tree and 64 MiB in all; vp*/ and .whl/ listed in
# .git/info/exclude, or every call carries them). The device calls, each fired
# as soon as the last returns (the machine goes back when idle), with budgets (estimates: nothing
# here has run on the x2 machine yet):
#   1. carry [".whl", "vp7"], timeout_s 120 (~20 s; the machine's cold start before it, minutes):
#      mkdir -p /tmp/vw && cp vp7/* /tmp/vw/ && mkdir -p /tmp/x2tree && cp -a $(ls -A | grep -v '^vp') /tmp/x2tree/ && cd /tmp/x2tree && (PHASE=all PIPE_S=1500 setsid nohup bash bench/multi_gpu_serve.sh > /tmp/x2-all.out 2>&1 < /dev/null &) && sleep 5 && cat /tmp/x2-all.out
#   2-6. carry ["vpN"] (N = 1..5), timeout_s 120 (~15-25 s each):
#      mkdir -p /tmp/vw && cp vpN/* /tmp/vw/
#   7. carry ["vp6"], timeout_s 600 (~590 s): the last part, the mark that starts the wheels'
#      install (the pipeline's watcher joins and installs them, ~60 s of CPU and disk), then the
#      pipeline's results so far:
#      mkdir -p /tmp/vw && cp vp6/* /tmp/vw/ && touch /tmp/vw/.all && cd /tmp/x2tree && PHASE=collect WAIT_S=540 bash bench/multi_gpu_serve.sh
#   8, 9. carry [], timeout_s 600 (~590 s each, the last returns as soon as the pipeline is done):
#      cd /tmp/x2tree && PHASE=collect WAIT_S=560 bash bench/multi_gpu_serve.sh
# Each collect call brings back summary.json (serve rows, ratios, the steps' rows, progress),
# summary.txt, progress.log and x2.tgz (every log and JSON line so far): 4 files of the 8 a call
# returns. Device time, ~1,750 s in all of the session's 1,800: the cold start (~150 s), call 1
# and the pipeline, whose estimated wall time a step is (in order; the calls 2-7 overlap it):
#   setup (device_env.sh: the wheels, kern installed)            25 s
#   ckpt: 8B (~60 s) then MoE 24 layers (~120 s), `tests` beside  180 s  (tests <= 150 s, not timed)
#   serve_tp: kern up ~40 s, 32 and 128 streams ~25 s, stop       70 s
#   serve_ep: kern up ~50 s, the two curves ~35 s, stop            90 s
#   vllm: both up ~300 s (a MoE alone took 268-282 s on one H200), each measured ~25 s, stopped   370 s
#   tp (bench/tp.py, 8B: its checkpoint, parity, decode)          170 s  (its timeout; run before
#         vllm instead when the wheels are not installed by then)
#   ep (24 layers: EP=1 and EP=2 loaded, decode 1/16/64)           180 s  (timeout 240)
#   ep_bench (kern bench, decode 1/16/64 @ 160, 3 samples)         150 s  (timeout 240)
#   serve_pp: --pp 2 up ~40 s + 128 streams, one GPU likewise     110 s
#   pp (micro-batches 2 and 4, run-ahead 1 and 8, the host loop)  200 s  (its timeout)
#   ~1,545 s. A step runs only while the pipeline's PIPE_S (default 1500) still holds its
#   estimate, else it is skipped with a note in progress.log: when time runs short the last
#   steps are the ones left out. Set PIPE_S from `status`'s budget_left_s before call 1:
#   budget_left_s - 300 (the cold start, the last collect's packing); a step may run past its
#   estimate up to its timeout.
# After it, the figures: summary.json's `ratios` (tp/ep: kern / vLLM; pp: --pp 2 / one GPU, each
# of output tok/s, TTFT p50, ITL p50; the tp target 1.3x and whether met), `rows` (a line a
# server and concurrency: out_tok_s, ttft_p50_ms, itl_p50_ms; also serve_rows.jsonl in x2.tgz),
# `steps` (multi_gpu.py's rows: tests' last line, tp's speedup, ep's same_tokens and tok/s,
# ep_bench's all_to_all_share, pp's), `startup_s`.
#
# Knobs: STEPS (default all of ckpt,tests,serve_tp,serve_ep,vllm,tp,ep,ep_bench,serve_pp,pp),
# CONC (32,128), PP_CONC (128), REQUESTS (256), MEMORY (40G), LAYERS (24), VLLM_KV_GIB (16),
# VLLM_TOGETHER (1), VLLM_UP_S (480), KERN_UP_S (240), CURVE_S (150 a concurrency), PIPE_S,
# WAIT_S (collect), X2_BG (/tmp/x2-bg: the pipeline's folder), X2_CK (/tmp/x2-ck: checkpoints),
# KERN_FLAGS (none: kern's default context, the model's 131,072 positions where --memory holds
# them; `--context 2048` matches vLLM's --max-model-len), PORT (8100: kern's; vLLM's + 2 and + 3).
# Where a warm machine already holds vLLM's wheels (/tmp/vsite.ok) and this tree: call 1 alone,
# then collect calls.
# A dry run on a laptop (tiny shapes on the cpu, a few requests; ~1 minute):
#   DRY=1 X2_BG=/tmp/x2-dry PHASE=all bash bench/multi_gpu_serve.sh; OUT=/tmp/x2-out X2_BG=/tmp/x2-dry PHASE=collect bash bench/multi_gpu_serve.sh
# DRY=1 VLLM=fake STEPS=ckpt,serve_tp,serve_ep,vllm: the vLLM block too, with kern serve on the cpu
# standing in for vLLM's server (its flags checked against the ones this script passes).
PHASE=${PHASE:?PHASE=all|wheels|collect}
DRY=${DRY:-0}
BG=${X2_BG:-/tmp/x2-bg}  # the pipeline's results and marks: outlive the call that started it
CK=${X2_CK:-/tmp/x2-ck}
VSITE=${VSITE:-/tmp/vsite}  # vLLM installed there (and $VSITE.ok once it is)
if [ "$DRY" = 1 ]; then
  TARGET=cpu SHAPE8=tiny SHAPEM=tiny LAYERS=${LAYERS:-3} MEMORY=${MEMORY:-1G} REQUESTS=${REQUESTS:-8}
  CONC=${CONC:-2,4} PP_CONC=${PP_CONC:-4} VLLM=${VLLM:-0} KERN_FLAGS="--target cpu" WORK_SHAPE="--prompt 64 --shared 32 --output 16"
  STEPS=${STEPS:-ckpt,serve_tp,serve_ep,ep,ep_bench,serve_pp,pp}
  MG_FLAGS="--new 32 --streams 4 --memory 1 --micro 2 --moe-batch 1,2 --bench-rows 1,2 --bench-samples 2"
else
  TARGET=cuda SHAPE8=llama-3.1-8b SHAPEM=qwen3-30b-a3b LAYERS=${LAYERS:-24} MEMORY=${MEMORY:-40G}
  REQUESTS=${REQUESTS:-256} CONC=${CONC:-32,128} PP_CONC=${PP_CONC:-128} VLLM=${VLLM:-1} KERN_FLAGS=${KERN_FLAGS:-}
  WORK_SHAPE="--prompt 512 --shared 256 --output 128"
  STEPS=${STEPS:-ckpt,tests,serve_tp,serve_ep,vllm,tp,ep,ep_bench,serve_pp,pp}
  MG_FLAGS=""
fi
C8=$CK/$SHAPE8
CM=$CK/$SHAPEM-$LAYERS
PIPE_S=${PIPE_S:-1500}
PORT=${PORT:-8100}  # kern's; vLLM's: PORT + 2 (tp), PORT + 3 (ep)
if [ "$DRY" = 1 ] && [ "$VLLM" = fake ]; then  # a stand-in for vLLM's server (kern serve on the cpu): the plumbing alone
  VSITE=$BG-fake-vllm VLLM=1
  mkdir -p $VSITE/vllm/entrypoints/openai && touch $VSITE.ok $VSITE/vllm/__init__.py $VSITE/vllm/entrypoints/__init__.py \
    $VSITE/vllm/entrypoints/openai/__init__.py
  cat > $VSITE/vllm/entrypoints/openai/api_server.py << 'PY'
import argparse, os, sys
ap = argparse.ArgumentParser()
for f in ("--model", "--port", "--max-model-len", "--gpu-memory-utilization", "--kv-cache-memory-bytes"):
    ap.add_argument(f, required=True)
ap.add_argument("--tensor-parallel-size", type=int, required=True)
ap.add_argument("--enable-expert-parallel", action="store_true")
a = ap.parse_args()
split = ["--ep" if a.enable_expert_parallel else "--tp", str(a.tensor_parallel_size)]
os.execvp(sys.executable, [sys.executable, "-m", "kern.cli", "serve", a.model, "--port", a.port, "--target", "cpu",
                           "--memory", "1G", *split])
PY
fi
MG="python3 bench/multi_gpu.py --target $TARGET --pp-shape $SHAPE8 --pp-ckpt $C8 --moe-shape $SHAPEM --moe-layers $LAYERS --moe-ckpt $CM"
T0=$(date +%s)

say() { echo "[$(($(date +%s) - T0)) s] $*" | tee -a $BG/progress.log; }
want() { [[ ",$STEPS," == *",$1,"* ]]; }
fits() {  # $1 a step, $2 its estimated seconds: run it only while the pipeline's budget holds it
  local left=$((PIPE_S - ($(date +%s) - T0)))
  [ $left -ge $2 ] && return 0
  say "$1: skipped ($left s of PIPE_S=$PIPE_S left, it takes ~$2 s)"
  return 1
}
vocab() { python3 -c "import json, sys; print(json.load(open(sys.argv[1] + '/config.json'))['vocab_size'])" $1; }
apps() { [ "$TARGET" = cuda ] && nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader 2> /dev/null | tr '\n' ' '; }

stop_group() {  # $1 a process group this script started (setsid: its leader's pid): SIGTERM, then SIGKILL what is left
  kill -TERM -- -$1 2> /dev/null
  for _ in $(seq 1 30); do kill -0 -- -$1 2> /dev/null || return 0; sleep 1; done
  kill -KILL -- -$1 2> /dev/null
  for _ in $(seq 1 10); do kill -0 -- -$1 2> /dev/null || return 0; sleep 1; done
}

. bench/servers.sh  # up (its stop and served are not used: the servers here are process groups)

measure() {  # $1 label, $2 url, $3 concurrencies, $4 vocabulary: the serve workload, a JSON line a concurrency
  for c in ${3//,/ }; do
    timeout ${CURVE_S:-150} python3 bench/serve.py --url $2 --label $1 --requests $REQUESTS $WORK_SHAPE --vocab $4 \
      --warmup ${WARMUP:-8} --concurrency $c >> $BG/$1.jsonl 2>> $BG/$1_bench.log
    say "$1 c=$c: $(python3 bench/multi_gpu_summary.py --last $BG/$1.jsonl)"
  done
}

came_up() {  # $1 label, $2 url, $3 deadline (date +%s), $4 pid, $5 start (date +%s.%N): wait for /health; its start-up in $BG/$1_startup.json
  local left=$(($3 - $(date +%s)))
  if up $2 $((left > 1 ? left : 1)) $4; then  # (one poll at least: up already, after the deadline, counts)
    echo "{\"label\": \"$1\", \"startup_s\": $(python3 -c "import time; print(round(time.time() - $5, 1))")}" > $BG/$1_startup.json
    say "$1 up in $(python3 -c "import json; print(json.load(open('$BG/$1_startup.json'))['startup_s'])") s (GPU apps: $(apps))"
    return 0
  fi
  say "$1 did not come up: $(tr '\r' '\n' < $BG/$1_serve.log | grep -v '^\s*$' | tail -4 | tr '\n' '|' | cut -c1-600)"
  return 1
}

kern_server() {  # $1 label, $2 checkpoint, $3 concurrencies, then kern serve's flags: start, measure, stop
  local label=$1 ckpt=$2 conc=$3; shift 3
  say "$label: starting (GPU apps before: $(apps))"
  local t0=$(date +%s.%N)
  setsid python3 -m kern.cli serve $ckpt --port $PORT --memory $MEMORY $KERN_FLAGS "$@" > $BG/${label}_serve.log 2>&1 < /dev/null &
  local pid=$!
  came_up $label http://127.0.0.1:$PORT $(($(date +%s) + ${KERN_UP_S:-240})) $pid $t0 && measure $label http://127.0.0.1:$PORT $conc $(vocab $ckpt)
  stop_group $pid
}

vllm_start() {  # $1 label, $2 port, $3 checkpoint, then vLLM's flags: started in its own process group
  local label=$1 port=$2 ckpt=$3; shift 3
  date +%s.%N > $BG/$label.t0
  say "$label: starting vLLM $* (GPU apps before: $(apps))"
  ( cd /tmp && PYTHONPATH=$VSITE:$PYTHONPATH HF_HUB_OFFLINE=1 exec setsid python3 -m vllm.entrypoints.openai.api_server \
    --model $ckpt --port $port --max-model-len 2048 --gpu-memory-utilization 0.1 \
    --kv-cache-memory-bytes $((${VLLM_KV_GIB:-16} << 30)) "$@" > $BG/${label}_serve.log 2>&1 < /dev/null ) &
  echo $! > $BG/$label.pid
}

vllm_up() {  # $1 label, $2 port, $3 when the start-ups began (date +%s): wait for it until VLLM_UP_S after then
  came_up $1 http://127.0.0.1:$2 $(($3 + ${VLLM_UP_S:-480})) $(cat $BG/$1.pid) $(cat $BG/$1.t0)
}

mg() {  # $1 a multi_gpu.py step, $2 its timeout: a --device run of it alone (its log and summary in $BG/mg_<step>)
  say "$1: starting (timeout $2 s)"
  OUT=$BG/mg_$1 $MG --device --no-install --steps $1 --${1//_/-}-timeout $2 $MG_FLAGS > $BG/mg_$1.out 2>&1
  say "$(grep -v '^\[' $BG/mg_$1.out | tail -1 | cut -c1-400)"
}

wheels() {  # join vLLM's wheel parts in /tmp/vw and install them into $VSITE (CPU and disk only)
  ( cat /tmp/vw/p_* > /tmp/vw.tar && mkdir -p /tmp/vwh && tar xf /tmp/vw.tar -C /tmp/vwh && rm /tmp/vw.tar \
    && python3 -m pip install -q --no-index --no-deps --no-compile --target $VSITE /tmp/vwh/*.whl \
    && touch $VSITE.ok ) > /tmp/vllm_install.log 2>&1
}

pack() {  # the summary, and everything in $BG as one archive: what comes back to $OUT (4 files)
  python3 bench/multi_gpu_summary.py $BG > $BG/summary.txt 2> $BG/summary.err
  cat $BG/summary.txt
  cp $BG/summary.json $BG/summary.txt $BG/progress.log $OUT/ 2> /dev/null
  tar czf $OUT/x2.tgz -C $BG --exclude='*.pid' --exclude='*.t0' .
}

case $PHASE in
all)
  rm -rf $BG && mkdir -p $BG $CK
  echo $$ > $BG/pid
  if [ "$DRY" = 1 ]; then
    echo "dry run: $(python3 -c 'import platform; print(platform.processor() or platform.machine())')" > $BG/gpu.txt
  else
    OUT=$BG . bench/device_env.sh > /dev/null || { say "setup failed: $(tail -3 $BG/pip.log)"; touch $BG/done; exit 1; }
    # (device_env.sh: the carried wheels into /tmp/site, kern installed from this tree)
    { nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv,noheader; nvidia-smi topo -m;
      df -h /dev/shm /tmp | tail -2; echo "cores $(nproc)"; } > $BG/gpu.txt 2>&1
    [ "$(nvidia-smi -L | grep -c '^GPU ')" -ge 2 ] || { say "fewer than 2 GPUs: $(nvidia-smi -L | tr '\n' ' ')"; touch $BG/done; exit 1; }
  fi
  say "pipeline: steps $STEPS, PIPE_S $PIPE_S"
  if [ "$VLLM" = 1 ] && want vllm; then  # the watcher: vLLM's wheels installed once call 7 marks the parts complete
    ( for _ in $(seq 1 ${PARTS_WAIT_S:-900}); do [ -f /tmp/vw/.all ] || [ -f $VSITE.ok ] && break; sleep 1; done
      [ -f $VSITE.ok ] || { [ -f /tmp/vw/.all ] && wheels; }
      say "vLLM wheels: $([ -f $VSITE.ok ] && echo installed || echo "not installed: $(tail -2 /tmp/vllm_install.log 2> /dev/null)")" ) &
  fi
  # 1. the checkpoints (made on the GPU, not timed), the multi-GPU tests beside them (correctness only)
  TESTS=""
  want tests && { mg tests ${TESTS_S:-150} & TESTS=$!; }
  if want ckpt; then
    $MG --make-ckpt llama > $BG/ckpt_llama.log 2>&1 || say "8B checkpoint failed: $(tail -2 $BG/ckpt_llama.log)"
    $MG --make-ckpt moe > $BG/ckpt_moe.log 2>&1 || say "MoE checkpoint failed: $(tail -2 $BG/ckpt_moe.log)"
    for c in $C8 $CM; do [ -f $c/config.json ] && python3 bench/serve.py --prepare $c; done
    say "checkpoints: $(du -sh $C8 $CM 2> /dev/null | cut -f1 | tr '\n' ' ')"
  fi
  [ -n "$TESTS" ] && wait $TESTS  # (the wheels' watcher runs on)
  # 2. kern serve --tp 2 and --ep 2, then vLLM on the same checkpoints
  want serve_tp && fits serve_tp 70 && kern_server kern_tp2 $C8 $CONC --tp 2
  want serve_ep && fits serve_ep 90 && kern_server kern_ep2 $CM $CONC --ep 2
  TP_DONE=0
  if [ "$VLLM" = 1 ] && want vllm && [ ! -f $VSITE.ok ] && want tp && fits tp 170; then
    mg tp ${TP_S:-170}; TP_DONE=1  # the GPUs' work while the wheels install
  fi
  if [ "$VLLM" = 1 ] && want vllm && fits vllm 370; then
    for _ in $(seq 1 ${WHEELS_WAIT_S:-300}); do [ -f $VSITE.ok ] && break; sleep 1; done
    if [ ! -f $VSITE.ok ]; then
      say "vllm: skipped, its wheels are not installed ($(tail -2 /tmp/vllm_install.log 2> /dev/null))"
    elif [ "${VLLM_TOGETHER:-1}" = 1 ]; then  # both up before either is measured (a start-up shares the GPUs)
      t=$(date +%s)
      vllm_start vllm_tp2 $((PORT + 2)) $C8 --tensor-parallel-size 2
      sleep 10
      vllm_start vllm_ep2 $((PORT + 3)) $CM --tensor-parallel-size 2 --enable-expert-parallel
      vllm_up vllm_tp2 $((PORT + 2)) $t && TP_UP=1
      vllm_up vllm_ep2 $((PORT + 3)) $t && EP_UP=1
      [ "${TP_UP:-0}" = 1 ] && measure vllm_tp2 http://127.0.0.1:$((PORT + 2)) $CONC $(vocab $C8)
      stop_group $(cat $BG/vllm_tp2.pid)
      [ "${EP_UP:-0}" = 1 ] && measure vllm_ep2 http://127.0.0.1:$((PORT + 3)) $CONC $(vocab $CM)
      stop_group $(cat $BG/vllm_ep2.pid)
    else
      vllm_start vllm_tp2 $((PORT + 2)) $C8 --tensor-parallel-size 2
      vllm_up vllm_tp2 $((PORT + 2)) $(date +%s) && measure vllm_tp2 http://127.0.0.1:$((PORT + 2)) $CONC $(vocab $C8)
      stop_group $(cat $BG/vllm_tp2.pid)
      vllm_start vllm_ep2 $((PORT + 3)) $CM --tensor-parallel-size 2 --enable-expert-parallel
      vllm_up vllm_ep2 $((PORT + 3)) $(date +%s) && measure vllm_ep2 http://127.0.0.1:$((PORT + 3)) $CONC $(vocab $CM)
      stop_group $(cat $BG/vllm_ep2.pid)
    fi
  fi
  # 3. multi_gpu.py's steps on the same checkpoints, then --pp 2 served against one GPU
  [ $TP_DONE = 0 ] && want tp && fits tp 170 && mg tp ${TP_S:-170}
  want ep && fits ep 180 && mg ep ${EP_S:-240}
  want ep_bench && fits ep_bench 150 && mg ep_bench ${EP_BENCH_S:-240}
  if want serve_pp && fits serve_pp 110; then
    kern_server kern_pp2 $C8 $PP_CONC --pp 2
    kern_server kern_pp1 $C8 $PP_CONC
  fi
  want pp && fits pp 200 && mg pp ${PP_S:-200}
  say "pipeline done"
  touch $BG/done
  ;;
wheels)  # by hand, where the watcher did not run: join and install vLLM's wheels now
  wheels; tail -3 /tmp/vllm_install.log; ls $VSITE.ok
  ;;
collect)  # wait for the pipeline (at most WAIT_S), then bring back what it has
  : "${OUT:?set OUT, the folder whose files come back from the device call}"
  for _ in $(seq 1 ${WAIT_S:-560}); do
    [ -f $BG/done ] && break
    kill -0 $(cat $BG/pid 2> /dev/null || echo 0) 2> /dev/null || { echo "the pipeline is not running (no done mark): $(tail -3 /tmp/x2-all.out 2> /dev/null)"; break; }
    sleep 1
  done
  [ -f $BG/done ] && echo "the pipeline is done" || echo "the pipeline is not done: its results so far"
  tail -5 $BG/progress.log 2> /dev/null
  pack
  ;;
*) echo "PHASE=$PHASE: all, wheels or collect"; exit 2 ;;
esac
