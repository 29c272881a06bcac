# Two device calls for the experimental builds (off in the pinned cubins; each is a generator
# option that turns on its kernel macros, see models/llama/manifest_cuda.py), each beside the
# default build in the same call:
#   bash bench/gpu_experiments.sh 1   kernel tests on the build with every macro, cp.async
#                                     staging kernel by kernel, decode: default, cpasync, tiles
#   bash bench/gpu_experiments.sh 2   decode: default, splits, cluster, plain, all
# If one wins: make its macros the default (and its option the generator's default), re-pin
# (models/llama/cuda/build.py OUT --record), regenerate the examples, run bench/gpu_final.sh.
source bench/gpu_env.sh || exit 1
run() {  # label, then decode.py options
  local label=$1; shift
  timeout 75 python3 bench/decode.py --shapes llama-3.2-1b,smollm2-135m --batch 1,16 --prefill 0 "$@" \
    > $OUT/decode_$label.log 2>&1
  grep '^{"' $OUT/decode_$label.log | grep -v '"gpu"' | python3 -c "
import json, sys
for l in sys.stdin:
    d = json.loads(l)
    print('$label', d['shape'], d['batch'], d['kern_decode_tok_s'], d['kern_step_ms'])"
}
if [ "${1:-1}" = 1 ]; then
  ALL="-DGEMV_TILE_LOOP=1 -DATTN_DYNAMIC_SPLIT=1 -DATTN_CLUSTER=1 -DGEMV_STAGE_PLAIN_MAX_K=1024 -DGEMV_STAGE_CPASYNC=1"
  KERN_CUDA_DEFINES="$ALL" timeout 150 python3 -m pytest tests/cuda/test_cuda_gpu_kernels.py -m gpu -q \
    -p no:cacheprovider > $OUT/experimental_tests.log 2>&1
  tail -3 $OUT/experimental_tests.log
  # cp.async staging kernel by kernel, the plain gemvs staged too (outputs compared with the default's)
  PYTHONPATH=$PYTHONPATH:tests/cuda timeout 120 python3 tests/cuda/bench_cuda_kernels.py bench_fused \
    "cpasync=-DGEMV_STAGE_CPASYNC=1 -DGEMV_STAGE_PLAIN_MAX_K=8192" 2>&1 | grep -E "^fused|Error" | sort -u \
    | tee $OUT/fused.log
  run default
  run cpasync --stage-cp-async
  run tiles --gemv-tiles-per-block auto
else
  run default
  run splits --decode-max-splits 8
  run cluster --decode-cluster-merge
  run plain --stage-plain-max-k 1024
  run all --gemv-tiles-per-block auto --decode-cluster-merge --stage-plain-max-k 1024 --stage-cp-async
fi
