# One device call for mla_tc.cu's split (issue 38's long contexts), from the repository root with
# $OUT set and .whl carried:
#   1. its GPU tests (tests/kimi_linear/test_cuda_gpu_mla_tc.py: the bits whole / cut across
#      chunk boundaries / decoded past several chunks / alone / batched, at chunks of 32, 64 and
#      the deployment's 2,048, and against float64 and the CUDA-core kernel), then
#   2. the probe (bench/probes/mla_tc.py: the short cases against CUDA cores; decode of 1 and 8
#      rows at 32,768 and 131,072, split against unsplit; prefill of 1 x 8,192 at 24,576),
#      $OUT/mla_tc.json.
#   TESTS=0 skips 1, BENCH=0 skips 2.
source bench/device_env.sh
if [ "${TESTS:-1}" = 1 ]; then
  timeout "${TESTS_S:-240}" python3 -m pytest -m gpu -q -p no:cacheprovider -rfEs \
    tests/kimi_linear/test_cuda_gpu_mla_tc.py > "$OUT/tests.txt" 2>&1
  grep -E "passed|failed|Error|assert" "$OUT/tests.txt" | tail -15
fi
if [ "${BENCH:-1}" = 1 ]; then
  timeout "${BENCH_S:-300}" python3 -m bench.probes.mla_tc > "$OUT/probe.txt" 2>&1
  tail -80 "$OUT/probe.txt"
fi
