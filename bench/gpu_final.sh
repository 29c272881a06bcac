# One device call: the GPU tests, then the decode/prefill benchmark. Logs land under $OUT.
source bench/gpu_env.sh || exit 1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $OUT/gpu.txt
timeout 220 python3 -m pytest tests/cuda -m gpu -q -p no:cacheprovider -s > $OUT/gpu_tests.log 2>&1
tail -5 $OUT/gpu_tests.log
timeout 170 python3 bench/decode.py --batch 1,16 --new 128 > $OUT/decode.log 2>&1
grep '^{' $OUT/decode.log | grep -v '"gpu"' ; tail -3 $OUT/decode.log
