# One device call: every GPU test, then decode tok/s at three decode attention splits (context
# tokens per block; the generator's default is 128), each beside transformers eager.
source bench/gpu_env.sh || exit 1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $OUT/gpu.txt
timeout 230 python3 -m pytest tests/cuda -m gpu -q -p no:cacheprovider > $OUT/gpu_tests.log 2>&1
tail -3 $OUT/gpu_tests.log
for split in ${SPLITS:-64 128 256}; do
  timeout 85 python3 bench/decode.py --shapes llama-3.2-1b,smollm2-135m --batch 1,16 --prefill 0 --new 96 \
    --decode-split $split > $OUT/decode_split$split.log 2>&1
  python3 bench/summary.py "split $split" < $OUT/decode_split$split.log
done
