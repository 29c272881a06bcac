# One device call: GPU tests (TESTS, a pytest -k expression, default attention, the model and
# kern test; none to skip), then decode tok/s of kernel variants side by side, each beside
# transformers eager (SHAPES, default Llama-3.2-1B and SmolLM2-135M; batch 1 and 16; prompt
# 32 + 128 new; eight steps a graph launch):
#   base: the models/ tree under AB_BASE (default ab_base/: `git archive <commit> models | tar
#         -x -C ab_base`, carried to the device as an ignored path; none to skip),
#   new:  this tree's models/,
#   FILE.NAME for each in VARIANTS: a copy of models/ whose llama/cuda/FILE.cu the sed script
#         bench/variants/FILE.NAME.sed changes (the alternatives measured and not kept).
# Logs land under $OUT.
source bench/gpu_env.sh || exit 1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $OUT/gpu.txt
if [ "${TESTS:-}" != none ]; then  # TESTS: a pytest -k expression, or none
  timeout ${TEST_S:-150} python3 -m pytest tests/cuda -m gpu -q -p no:cacheprovider -k "${TESTS:-attention or model or kern_test}" \
    > $OUT/gpu_tests.log 2>&1
  tail -3 $OUT/gpu_tests.log
fi
run() {  # name, models dir, extra decode.py flags
  mkdir -p /tmp/km_$1 && ln -sfn "$2" /tmp/km_$1/kern_models
  PYTHONPATH=/tmp/site:$PWD/src:/tmp/km_$1 KERN_CACHE=/tmp/kern-cache-$1 timeout ${BENCH_S:-100} python3 bench/decode.py \
    --shapes ${SHAPES:-llama-3.2-1b,smollm2-135m} --batch 1,16 --prefill 0 --run-ahead 8 "${@:3}" > $OUT/decode_$1.log 2>&1
  python3 bench/summary.py $1 < $OUT/decode_$1.log
}
[ "${AB_BASE:-}" != none ] && run base "$PWD/${AB_BASE:-ab_base}/models"
run new "$PWD/models"
for v in $VARIANTS; do
  rm -rf /tmp/var_$v && cp -r models /tmp/var_$v && sed -i -f bench/variants/$v.sed /tmp/var_$v/llama/cuda/${v%%.*}.cu
  run $v /tmp/var_$v
done
