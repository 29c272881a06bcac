# One device call: every GPU test, then bench/decode.py on all three shapes (prefill of 2,040
# tokens, decode at batch 1 and 16, eight steps a graph launch, the default), side by side
# with transformers eager. Logs land under $OUT.
source bench/gpu_env.sh || exit 1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $OUT/gpu.txt
timeout ${TEST_S:-160} python3 -m pytest tests/cuda -m gpu -q -p no:cacheprovider > $OUT/gpu_tests.log 2>&1
tail -3 $OUT/gpu_tests.log
timeout ${BENCH_S:-170} python3 bench/decode.py --batch 1,16 --new 128 --prefill 2040 --run-ahead 8 > $OUT/decode.log 2>&1
python3 bench/summary.py < $OUT/decode.log
