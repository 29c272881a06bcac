# One device call for the tensor-core attention (models/common/cuda/attention_tc.cuh): its GPU
# tests (attention_rows gives a prompt row the bytes of the token decoded; decode against an
# fp64 reference, its split merge and head groups), then kern's attention kernels timed
# (tests/cuda/bench_cuda_kernels.py: a prompt's rows beside prefill_attention, decode at 1 / 16
# rows and contexts 16 .. 4,096, head groups), beside tests/cuda/_variants/<label>/ when present.
# From the repository root, $OUT set, .whl carried. TESTS=0 / BENCH=0 skip a part.
source bench/device_env.sh
if [ "${TESTS:-1}" = 1 ]; then
  timeout "${TESTS_S:-200}" python3 -m pytest -m gpu -q -p no:cacheprovider -rfEs -k "attention or prefill" \
    tests/cuda/test_cuda_gpu_invariant.py tests/cuda/test_cuda_gpu_kernels.py tests/cuda/test_cuda_gpu_prefill.py \
    > "$OUT/tests.txt" 2>&1
  grep -E "passed|failed|Error|assert" "$OUT/tests.txt" | tail -15
fi
if [ "${BENCH:-1}" = 1 ]; then
  timeout "${BENCH_S:-200}" python3 -m tests.cuda.bench_cuda_kernels bench_rows bench_attention bench_attention_groups \
    > "$OUT/attn.txt" 2>&1
  grep -E "^(rows|attn)|failed|Error" "$OUT/attn.txt"
fi
