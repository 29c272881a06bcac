# One device call for issue 39's item 4: vLLM 0.26 with kern's forward pass (the plugin,
# KernForCausalLM) against vLLM with its own model, on the serve workload of bench/serve.py
# (512-token prompts sharing 256, 128 out; CONC streams, default 32 and 128; one stream alone),
# on a seeded random Llama-3.2-1B-shaped checkpoint made here. Both vLLMs run with their
# defaults (graphs, prefix caching, chunked prefill), one after the other, alone on the GPU.
#
# Before it: the vLLM wheel parts in /tmp/vw (bench/serve_gpu.sh's header: one call a vpN part,
# `mkdir -p /tmp/vw && cp vpN/* /tmp/vw/`). Then, from the repository root:
#
#   run(command="OUT=$OUT bash bench/vllm_kern_gpu.sh", carry=[".whl"], timeout_s=600)
#
# Results: $OUT/<label>.jsonl and <label>_lone.jsonl (bench/serve.py's lines), the servers' logs
# and start-up times; labels vllm_kern and vllm. docs/vllm.md says how to read them. TRACE=1 adds
# the steps vLLM fed kern (vllm_steps.trace) and kern bench's pricing of them (vllm_steps_bench.*).
# LOGITS=1 first runs bench/vllm_logits.py (the plugin's and vLLM's own teacher-forced logits
# against transformers fp32, judged by transformers' bf16 spread: vllm_logits.json). CLEAN=1
# first installs this tree as a user does, `pip install '.[vllm]'` into a fresh venv over the
# image's site-packages (torch, cuda-bindings) from the wheel folders alone, and runs
# tests/hosts/test_vllm_gpu.py with that venv's python (vllm serve with the plugin against kern
# serve, text for text: clean_install.log, vllm_gpu_test.txt; TEST_K=expr runs the tests pytest's
# -k picks, e.g. TEST_K=greedy_text, the text test alone, ~120 s where both take ~245).
# TRACE_FILE=bench/traces/vllm_llama1b_c32.trace with TRACE=1 prices a trace an earlier call took
# (vLLM eager at 32 streams on this script's checkpoint and deployment, 2026-12-04) without
# starting vLLM again: kern bench alone, ~70 s.
# CLEAN=1 needs, beside the peer set, the wheels of vLLM's requirements the image lacks (pip
# re-checks an installed vLLM's requirements): `python3 bench/vllm_deps.py --freeze
# image_freeze.txt --peer-wheels DIR` here makes them and their parts vd1..vdN (image_freeze.txt
# is what any CLEAN=1 call writes to $OUT); join them on the device in /tmp/vd first.
: "${OUT:?set OUT, the folder whose files come back from the device call}"
. bench/device_env.sh  # the carried wheels into /tmp/site, kern installed from this tree (its entry points)
CKPT=/tmp/vllm-ckpt
CONC=${CONC:-32,128}
MAXLEN=${MAXLEN:-2048}
WORK="--prompt 512 --shared 256 --output 128"

( cat /tmp/vw/p_* > /tmp/vw.tar && mkdir -p /tmp/vwh && tar xf /tmp/vw.tar -C /tmp/vwh \
  && python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/vsite /tmp/vwh/*.whl ) \
  > $OUT/vllm_install.log 2>&1 || { tail -5 $OUT/vllm_install.log; exit 1; }
timeout 90 python3 -c "from kern_models.common.random_checkpoint import make; make('llama-3.2-1b', '$CKPT', device='cuda', max_positions=131072)" \
  > $OUT/checkpoint.log 2>&1 || { tail -5 $OUT/checkpoint.log; exit 1; }
python3 bench/serve.py --prepare $CKPT
. bench/servers.sh  # up, stop, served
if [ "${CLEAN:-0}" = 1 ]; then
  # device_env.sh put its carried wheels (/tmp/site) and this tree's kern (/tmp/kern-install) on
  # PYTHONPATH: pip would read them as installed (fastapi 0.165, llguidance 1.9: versions vLLM 0.26
  # refuses: ResolutionImpossible, docs/perf-history.md), so the image's list and the clean
  # install see the image alone
  env -u PYTHONPATH python3 -m pip list --format=freeze > $OUT/image_freeze.txt 2> /dev/null  # bench/vllm_deps.py --freeze
  PY=/tmp/cvenv/bin/python  # the clean install's; if it cannot be made, the image's python over the peer wheels
  # The image's python3 is itself a venv (/opt/torch/.venv): --system-site-packages would reach the
  # interpreter's base, not its torch and numpy, so the image's site-packages go in by a .pth (after
  # the clean venv's own, which therefore wins where both hold a package).
  # The user the issue names is a team already running vLLM: their environment holds vLLM, and
  # `pip install '.[vllm]'` resolves kern's own requirements beside it. So vLLM goes into the clean
  # venv first as this image can hold it offline (its wheels without their dependency closure,
  # --no-deps: the rest of vLLM 0.26's closure over this image is some 44 wheels, ~530 MB,
  # cutlass-dsl and tilelang among them), then the clone is installed with pip resolving as a user's would.
  # pip re-checks the installed vLLM's own requirements: the wheels of those the image lacks or holds
  # at a version vLLM refuses come from bench/vllm_deps.py (its parts vdN joined in /tmp/vd
  # beforehand, as the peer set's in /tmp/vw); among them llguidance 1.7 (vLLM 0.26 declares
  # >=1.7,<1.8; the peer set's 1.6.1 is left out) and setuptools < 81.
  python3 -m venv /tmp/cvenv && python3 -c "import site; print('\n'.join(site.getsitepackages()))" \
    > /tmp/cvenv/lib/python3.12/site-packages/image.pth \
    && env -u PYTHONPATH $PY -m pip install -q --no-index --no-deps $(ls /tmp/vwh/*.whl | grep -v /llguidance-) \
      > $OUT/clean_install.log 2>&1 \
    && { [ ! -d /tmp/vd ] || { mkdir -p /tmp/vdw && cat /tmp/vd/p_* | tar xf - -C /tmp/vdw; }; } \
    && env -u PYTHONPATH $PY -m pip install -q --no-index --find-links .whl --find-links /tmp/vdw '.[vllm]' >> $OUT/clean_install.log 2>&1 \
    && env -u PYTHONPATH $PY -c "from importlib.metadata import entry_points, version; print(entry_points(group='vllm.general_plugins'), version('kern-engine'), version('vllm'))" \
      >> $OUT/clean_install.log 2>&1 || { echo "the clean install failed:"; grep -v WARNING $OUT/clean_install.log | tail -5; PY=python3; }
  PYTHONPATH=$([ $PY = python3 ] && echo /tmp/vsite:$PYTHONPATH) timeout ${TEST_S:-400} $PY -m pytest -m gpu -v \
    -p no:cacheprovider -rfEs ${TEST_K:+-k "$TEST_K"} tests/hosts/test_vllm_gpu.py > $OUT/vllm_gpu_test.txt 2>&1; tail -3 $OUT/vllm_gpu_test.txt
fi

measure() {  # $1 label, $2 url
  timeout ${LONE_S:-60} python3 bench/serve.py --url $2 --label $1 --requests 4 --warmup 1 \
    --prompt 128 --shared 0 --output 512 --concurrency 1 >> $OUT/$1_lone.jsonl 2>> $OUT/$1_bench.log
  for c in ${CONC//,/ }; do
    n=$((c * 2)); [ $n -lt 256 ] && n=256
    timeout ${CURVE_S:-90} python3 bench/serve.py --url $2 --label $1 --requests $n $WORK --concurrency $c \
      >> $OUT/$1.jsonl 2>> $OUT/$1_bench.log
  done
}

# kern's deployment for the checkpoint at vLLM's context (what the plugin generates when
# KERN_MANIFEST is unset; generated here first so that its cubins are not built inside vLLM's start-up)
MANIFEST=$(PYTHONPATH=/tmp/vsite:$PYTHONPATH python3 -c "from pathlib import Path; from kern.deployments import deployment_for; print(deployment_for(Path('$CKPT'), 'sm_90a', context=$MAXLEN))")
if [ "${LOGITS:-0}" = 1 ]; then
  PYTHONPATH=/tmp/vsite:$PYTHONPATH timeout ${LOGITS_S:-300} python3 bench/vllm_logits.py --ckpt $CKPT --manifest $MANIFEST \
    --out $OUT/vllm_logits.json --context $MAXLEN > $OUT/vllm_logits.txt 2>&1; tail -6 $OUT/vllm_logits.txt | cut -c1-400
fi
if [ "${MEASURE:-1}" = 1 ]; then  # MEASURE=0: the checks alone (CLEAN, LOGITS, TRACE), no serve curves
  for peer in vllm_kern vllm; do
    extra=""; [ $peer = vllm_kern ] && extra='--hf-overrides {"architectures":["KernForCausalLM"]}'
    T0=$(date +%s.%N)
    KERN_MANIFEST=$MANIFEST PYTHONPATH=/tmp/vsite:$PYTHONPATH HF_HUB_OFFLINE=1 python3 -m vllm.entrypoints.openai.api_server \
      --model $CKPT --port 8102 --max-model-len $MAXLEN $extra > $OUT/${peer}_serve.log 2>&1 &
    PID=$!
    served $peer http://127.0.0.1:8102 ${VLLM_UP_S:-300} $PID $T0 $OUT $OUT/${peer}_serve.log
    stop $PID
  done
fi
# TRACE=1: where vLLM's steps spend kern's time. vLLM with the plugin once more, eager (its decode
# graphs replay without calling the model, so a trace of a graphed vLLM misses them), KERN_TRACE
# recording every call it fed kern at 32 streams; then `kern bench` of that trace (docs/vllm.md).
if [ "${TRACE:-0}" = 1 ]; then
  if [ -n "${TRACE_FILE:-}" ]; then
    cp "$TRACE_FILE" $OUT/vllm_steps.trace  # a trace an earlier call took (bench/traces/), priced alone
  else
    KERN_TRACE=$OUT/vllm_steps.trace KERN_MANIFEST=$MANIFEST PYTHONPATH=/tmp/vsite:$PYTHONPATH HF_HUB_OFFLINE=1 \
      python3 -m vllm.entrypoints.openai.api_server --model $CKPT --port 8102 --max-model-len $MAXLEN --enforce-eager \
      --hf-overrides '{"architectures":["KernForCausalLM"]}' > $OUT/vllm_trace_serve.log 2>&1 &
    PID=$!
    if up http://127.0.0.1:8102 ${VLLM_UP_S:-300} $PID; then
      timeout ${CURVE_S:-90} python3 bench/serve.py --url http://127.0.0.1:8102 --label vllm_trace --requests 64 $WORK \
        --concurrency 32 > /dev/null 2>> $OUT/vllm_trace_bench.log
    fi
    stop $PID
  fi
  timeout ${TRACE_BENCH_S:-150} kern bench $MANIFEST --workload $OUT/vllm_steps.trace --weights $CKPT \
    --json $OUT/vllm_steps_bench.json > $OUT/vllm_steps_bench.txt 2>&1
  head -40 $OUT/vllm_steps_bench.txt
  (cd $OUT && tar czf trace.tgz vllm_steps.trace vllm_steps_bench.* $(ls vllm_trace_*.log 2> /dev/null) && rm -f vllm_steps.trace vllm_steps_bench.* vllm_trace_*.log)  # a call returns 8 files
fi
python3 - "$OUT" <<'PY'
import json, sys
from pathlib import Path
out = Path(sys.argv[1])
for f in sorted(out.glob("*.jsonl")):
    for line in f.read_text().splitlines():
        try:
            r = json.loads(line)
        except ValueError:
            continue
        print(f.stem, {k: r[k] for k in r if k in ("concurrency", "completed", "failed", "output_throughput", "ttft_ms", "itl_ms")})
PY
