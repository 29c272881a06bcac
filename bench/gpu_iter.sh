# One device call while tuning decode kernels: fused-vs-plain kernel timings, the GPU tests,
# then the decode/prefill benchmark. Logs land under $OUT.
source bench/gpu_env.sh || exit 1
PYTHONPATH=$PYTHONPATH:tests/cuda timeout 100 python3 tests/cuda/bench_cuda_kernels.py bench_fused 2>&1 | grep -E "^fused" | sort -u | tee $OUT/fused.log
bash bench/gpu_final.sh
