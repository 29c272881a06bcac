# One device call for the many-row tensor-core kernels (gemm.cu on wgmma), from the repository
# root with $OUT set and .whl carried (pydantic and the other wheels the image lacks):
#   1. their bit-for-bit GPU tests (tests/cuda/test_cuda_gpu_invariant.py: every row the gemv's
#      bytes at every row count, every llama-family projection shape), and
#   2. the layer projections beside cuBLASLt's (tests/cuda/bench_cuda_kernels.py bench_gemm).
#   TESTS=0 skips 1, BENCH=0 skips 2; PYTEST_K narrows 1 (a -k expression).
: "${OUT:?set OUT, the folder whose files come back from the device call}"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl \
  > "$OUT/pip.log" 2>&1 || { tail -3 "$OUT/pip.log"; exit 1; }
mkdir -p /tmp/km && ln -sfn "$PWD/models" /tmp/km/kern_models
export PYTHONPATH="/tmp/site:$PWD/src:/tmp/km:$PWD/tests/cuda" PYTHONUNBUFFERED=1 KERN_CACHE=/tmp/kern-cache
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
if [ "${TESTS:-1}" = 1 ]; then
  timeout "${TESTS_S:-300}" python3 -m pytest -m gpu -q -p no:cacheprovider -rfEs ${PYTEST_K:+-k "$PYTEST_K"} \
    tests/cuda/test_cuda_gpu_invariant.py > "$OUT/tests.txt" 2>&1
  grep -E "passed|failed|Error|assert" "$OUT/tests.txt" | tail -15
fi
if [ "${BENCH:-1}" = 1 ]; then
  timeout "${BENCH_S:-240}" python3 tests/cuda/bench_cuda_kernels.py bench_gemm > "$OUT/gemm.txt" 2>&1
  grep -E "layer projections|failed|Error" "$OUT/gemm.txt"
fi
