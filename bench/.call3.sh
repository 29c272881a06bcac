source bench/device_env.sh
timeout 150 python3 -m pytest -m gpu -q -p no:cacheprovider -rfEs tests/kimi_linear/test_cuda_gpu_kda_tc.py tests/kimi_linear/test_cuda_gpu_invariant.py tests/kimi_linear/test_invariance_gpu.py > $OUT/tests.txt 2>&1; tail -4 $OUT/tests.txt
timeout 60 python3 bench/probes/kda_tc.py > $OUT/probe.txt 2>&1; grep -A12 decode_64 $OUT/probe.txt | head -30
timeout 420 python3 bench/kimi_gpu.py --layers 8 --steps ckpt,parity,decode,profile,serve > $OUT/kimi8.txt 2>&1; tail -30 $OUT/kimi8.txt
