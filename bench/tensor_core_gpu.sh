# One device call for the many-row tensor-core kernels (gemm.cu on wgmma), from the repository
# root with $OUT set and .whl carried (pydantic and the other wheels the image lacks):
#   1. their bit-for-bit GPU tests (tests/cuda/test_cuda_gpu_invariant.py: every row the gemv's
#      bytes at every row count, every llama-family projection shape), and
#   2. the layer projections beside cuBLASLt's (tests/cuda/bench_cuda_kernels.py bench_gemm).
#   TESTS=0 skips 1, BENCH=0 skips 2; PYTEST_K narrows 1 (a -k expression).
source bench/device_env.sh
if [ "${TESTS:-1}" = 1 ]; then
  timeout "${TESTS_S:-300}" python3 -m pytest -m gpu -q -p no:cacheprovider -rfEs ${PYTEST_K:+-k "$PYTEST_K"} \
    tests/cuda/test_cuda_gpu_invariant.py > "$OUT/tests.txt" 2>&1
  grep -E "passed|failed|Error|assert" "$OUT/tests.txt" | tail -15
fi
if [ "${BENCH:-1}" = 1 ]; then
  timeout "${BENCH_S:-240}" python3 -m tests.cuda.bench_cuda_kernels bench_gemm > "$OUT/gemm.txt" 2>&1
  grep -E "layer projections|failed|Error" "$OUT/gemm.txt"
fi
