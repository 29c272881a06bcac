# The gemv decode kernels of this tree beside those of an earlier revision, at 1 / 16 / 32 rows on
# the Llama-3.2-1B and SmolLM2 shapes (tests/cuda/bench_cuda_kernels.py bench_gemv, bench_fused):
# where a lone stream's decode time went (953 tok/s on 2026-11-29, 724-775 since the gemv took the
# wgmma's k16 sets with 8-byte weight loads in fe9a92f).
#   here, first:   bash bench/gemv_variants_gpu.sh --prepare [REV]   (default fe9a92f^; writes
#                  tests/cuda/_variants/old from git: the device's copy of the tree has no history)
#   device call:   bash bench/gemv_variants_gpu.sh   with carry [".whl", "tests/cuda/_variants"]
V=tests/cuda/_variants/old
if [ "${1:-}" = --prepare ]; then
  REV=${2:-fe9a92f^}
  rm -rf $V && mkdir -p $V
  for f in gemv.cu gemv.cuh rope.cuh; do git show "$REV:models/llama/kernels/cuda/$f" > $V/$f; done
  for f in $(git ls-tree --name-only "$REV" models/common/cuda/); do git show "$REV:$f" > $V/$(basename $f); done
  ls $V; exit 0
fi
[ -d $V ] || { echo "no $V: run with --prepare here first, and carry it"; exit 1; }
source bench/device_env.sh
timeout "${BENCH_S:-240}" python3 -m tests.cuda.bench_cuda_kernels \
  bench_gemv bench_fused > "$OUT/gemv.txt" 2>&1
grep -E "^(gemv|fused)|failed|Error" "$OUT/gemv.txt" | head -40
