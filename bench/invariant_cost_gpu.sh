# One device call: the batch-invariant sm_90a build (tree NEW) checked, then measured beside a
# base tree (BASE, e.g. the cuBLASLt build before it) on the same GPU, one after the other:
#   1. NEW's invariance: tests/cuda/test_cuda_gpu_invariant.py and tests/generation/test_invariance_gpu.py,
#      then bench/invariance.py --target cuda (every case must say identical, difference 0.0);
#   2. NEW's projections against cuBLASLt (tests/cuda/bench_cuda_kernels.py's bench_gemm);
#   3. for BASE then NEW: decode steps at batch 1 / 16 / 64 on the Llama-3.2-1B shape
#      (bench/crossover.py, every decode program at each batch it holds) and kern serve's
#      benchmark with no flags at concurrency 32 and 128 (bench/serve_gpu.sh's workload, no peer).
# Last, one line a concurrency: NEW's output tok/s over BASE's (the issue's target: >= 0.9).
#
#   bash bench/invariant_cost_gpu.sh NEW BASE      (from the repository root on the device, $OUT set,
#                                                  the wheels of .whl carried: bench/gpu.py says which)
#
# Each tree runs with its own src/ and models/ first on PYTHONPATH (no editable install can
# shadow the other) and its own KERN_CACHE.
: "${OUT:?set OUT, the folder whose files come back from the device call}"
NEW=$(cd "$1" && pwd)
BASE=$(cd "$2" && pwd)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl \
  > "$OUT/pip.log" 2>&1
side_env() {  # $1 tree, $2 label: the environment that runs that tree's kern and kern_models
  mkdir -p "/tmp/km-$2" && ln -sfn "$1/models" "/tmp/km-$2/kern_models"
  echo "PYTHONPATH=/tmp/site:$1/src:/tmp/km-$2 KERN_CACHE=/tmp/kc-$2 PYTHONUNBUFFERED=1"
}
NEW_ENV=$(side_env "$NEW" new)
BASE_ENV=$(side_env "$BASE" base)

cd "$NEW" || exit 1
env $NEW_ENV timeout 240 python3 -m pytest -m gpu -q -p no:cacheprovider -rfEs tests/cuda/test_cuda_gpu_invariant.py \
  tests/generation/test_invariance_gpu.py > "$OUT/invariance_tests.txt" 2>&1
tail -3 "$OUT/invariance_tests.txt"
env $NEW_ENV timeout 150 python3 bench/invariance.py --target cuda 2> /dev/null | tee "$OUT/invariance.json"
# (run from $NEW, which python3 -c puts first on sys.path: tests.cuda is NEW's)
env $NEW_ENV timeout 90 python3 -c "
import tempfile, numpy as np
from pathlib import Path
from kern_models.llama.kernels.cuda import CUBINS
from kern.runtime.devices.cuda.driver import open_device
from tests.cuda import bench_cuda_kernels as B
from tests.cuda.cuda_gpu import Gpu
out = Path(tempfile.mkdtemp()); CUBINS.provide(out)
lines = []; B.bench_gemm(Gpu(open_device(0), out), np.random.default_rng(0), lines); print('\n'.join(lines))" \
  > "$OUT/gemm.txt" 2>&1
grep "layer projections" "$OUT/gemm.txt"

for side in base new; do
  if [ $side = base ]; then tree=$BASE; e=$BASE_ENV; else tree=$NEW; e=$NEW_ENV; fi
  cd "$tree" || exit 1
  # NEW's crossover.py for both trees (a base whose copy still calls Runner._run, gone since the
  # runner launches without waiting, dies before its first line). It prints a JSON line a
  # (program, batch), each with "program", then a summary line without it; its stderr (the
  # checkpoint's progress, any traceback) goes to a file that comes back.
  env $e timeout 200 python3 "$NEW/bench/crossover.py" --batch 1,16,64 --repeats 5 2> "$OUT/decode_$side.err" \
    | grep '"program"' > "$OUT/decode_$side.jsonl"
  [ -s "$OUT/decode_$side.jsonl" ] || tail -5 "$OUT/decode_$side.err"
  mkdir -p "/tmp/serve_$side"
  env $e OUT="/tmp/serve_$side" PEER=none CONC=32,128 LONE=0 LONG_PROMPT=0 timeout 400 bash bench/serve_gpu.sh \
    > "$OUT/serve_$side.log" 2>&1
  cp "/tmp/serve_$side/kern.jsonl" "$OUT/serve_$side.jsonl" 2> /dev/null
  echo "$side decode:"; cat "$OUT/decode_$side.jsonl"
done
python3 - "$OUT" <<'EOF'
import json, sys
from pathlib import Path
out = Path(sys.argv[1])
def rates(side):
    p = out / f"serve_{side}.jsonl"
    rows = [json.loads(l) for l in p.read_text().splitlines() if l.strip()] if p.is_file() else []
    return {r["concurrency"]: r["output_throughput"] for r in rows}
base, new = rates("base"), rates("new")
for c in sorted(set(base) | set(new)):
    b, n = base.get(c), new.get(c)
    ratio = f"{n / b:.3f}" if b and n else "n/a"
    print(json.dumps({"concurrency": c, "base_output_tok_s": b, "new_output_tok_s": n, "new_over_base": ratio}))
EOF
