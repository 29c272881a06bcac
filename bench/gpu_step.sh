# One device call: where a decode step's time goes (bench/profile_step.py: host step, replay,
# each kernel left out), the device and model GPU tests, then decode tok/s without prefill.
source bench/gpu_env.sh || exit 1
(cd bench && timeout 200 python3 profile_step.py --shapes llama-3.2-1b,smollm2-135m --batch 1,16 --context 96 \
  2>/dev/null | grep '^{' > $OUT/profile.log); cat $OUT/profile.log
timeout 150 python3 -m pytest tests/cuda/test_cuda_gpu_device.py tests/cuda/test_cuda_gpu_model.py -m gpu -q \
  -p no:cacheprovider > $OUT/gpu_tests.log 2>&1; tail -3 $OUT/gpu_tests.log
timeout 150 python3 bench/decode.py --shapes llama-3.2-1b,smollm2-135m --batch 1,16 --prefill 0 > $OUT/decode.log 2>&1
python3 bench/summary.py < $OUT/decode.log
