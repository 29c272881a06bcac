# One device call: decode with the reach var left at its bound (the grid of the context bound)
# against the default (the grid of the step's reach), Llama-3.2-1B and SmolLM2-135M, batch 1
# and 16, same call. Logs land under $OUT.
source bench/gpu_env.sh || exit 1
for mode in bound reach; do
  timeout 150 python3 bench/decode.py --shapes llama-3.2-1b,smollm2-135m --batch 1,16 --prefill 0 \
    $([ $mode = bound ] && echo --no-reach) > $OUT/decode_$mode.log 2>&1
  python3 bench/summary.py $mode < $OUT/decode_$mode.log
done
