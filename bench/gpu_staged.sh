# One device call for the experimental staged-x gemv (gemv.cu, GEMV_STAGE_ELEMS): the kernel
# tests on that build, then the fused-kernel timings of the pinned build beside it (outputs
# compared). If it wins: make it the default in gemv.cu, re-pin (build.py --record), regenerate
# the examples, and run bench/gpu_final.sh.
source bench/gpu_env.sh || exit 1
STAGED="-DGEMV_STAGE_ELEMS=16000"
KERN_CUDA_DEFINES="$STAGED" timeout 200 python3 -m pytest tests/cuda/test_cuda_gpu_kernels.py -m gpu -q \
  -p no:cacheprovider > $OUT/staged_tests.log 2>&1
tail -3 $OUT/staged_tests.log
PYTHONPATH=$PYTHONPATH:tests/cuda timeout 200 python3 tests/cuda/bench_cuda_kernels.py bench_fused "staged=$STAGED" \
  2>&1 | grep -E "^fused|Error" | sort -u | tee $OUT/fused_staged.log
