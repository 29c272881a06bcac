# One device call for the experimental gemv builds (gemv.cu: GEMV_STAGE_ELEMS stages x in shared
# memory, GEMV_TILE_STRIDE lets a block walk several column tiles): the kernel tests on the
# build with both, then the fused-kernel timings of the pinned build beside each (outputs
# compared). If one wins: make it the default in gemv.cu (and, for the stride, give the
# manifest's gemv grids about two blocks an SM), re-pin (build.py --record), regenerate the
# examples, and run bench/gpu_final.sh.
source bench/gpu_env.sh || exit 1
STAGED="-DGEMV_STAGE_ELEMS=16000"
BOTH="$STAGED -DGEMV_TILE_STRIDE=1"
KERN_CUDA_DEFINES="$BOTH" timeout 200 python3 -m pytest tests/cuda/test_cuda_gpu_kernels.py -m gpu -q \
  -p no:cacheprovider > $OUT/staged_tests.log 2>&1
tail -3 $OUT/staged_tests.log
PYTHONPATH=$PYTHONPATH:tests/cuda timeout 240 python3 tests/cuda/bench_cuda_kernels.py bench_fused "staged=$STAGED" \
  "stride=$BOTH" 2>&1 | grep -E "^fused|Error" | sort -u | tee $OUT/fused_staged.log
