# One device call: every GPU test, then bench/decode.py one step a host wait and eight
# (Engine.run_steps, --run-ahead 8) side by side with transformers eager, all three shapes.
# Logs land under $OUT.
source bench/gpu_env.sh || exit 1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $OUT/gpu.txt
timeout 230 python3 -m pytest tests/cuda -m gpu -q -p no:cacheprovider > $OUT/gpu_tests.log 2>&1
tail -3 $OUT/gpu_tests.log
for ahead in 1 8; do
  timeout 170 python3 bench/decode.py --batch 1,16 --new 128 --prefill $([ $ahead = 1 ] && echo 2040 || echo 0) \
    --run-ahead $ahead > $OUT/decode_ahead$ahead.log 2>&1
  grep '^{"' $OUT/decode_ahead$ahead.log | grep -v '"gpu"' | python3 -c "
import json, sys
for l in sys.stdin:
    d = json.loads(l)
    if 'prefill_tokens' in d: print('prefill', d['shape'], d['kern_prefill_ms'], 'ms; sdpa', d['hf_sdpa_forward_ms']); continue
    print('ahead $ahead', d['shape'], d['batch'], d['kern_decode_tok_s'], 'tok/s', d['kern_step_ms'], 'ms; eager', d['hf_eager_decode_tok_s'])"
done
