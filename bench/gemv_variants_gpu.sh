# One device call: the gemv decode kernels of this tree beside those of an earlier revision
# (REV, default fe9a92f^: before the gemv took the wgmma's k16 sets with 8-byte weight loads),
# at 1 / 16 / 32 rows on the Llama-3.2-1B and SmolLM2 shapes (tests/cuda/bench_cuda_kernels.py
# bench_gemv and bench_fused): where a lone stream's decode time went. From the repository root,
# $OUT set, .whl carried; the earlier sources are taken from git here, so run it where the
# history is (this machine's checkout is copied with its .git).
source bench/device_env.sh
REV=${REV:-fe9a92f^}
V=tests/cuda/_variants/old
rm -rf $V && mkdir -p $V
for f in gemv.cu gemv.cuh rope.cuh; do git show "$REV:models/llama/kernels/cuda/$f" > $V/$f; done
for f in $(git ls-tree --name-only "$REV" models/common/cuda/); do git show "$REV:$f" > $V/$(basename $f); done
PYTHONPATH="$PYTHONPATH:$PWD/tests/cuda" timeout "${BENCH_S:-240}" python3 tests/cuda/bench_cuda_kernels.py \
  bench_gemv bench_fused > "$OUT/gemv.txt" 2>&1
grep -E "^(gemv|fused)|failed|Error" "$OUT/gemv.txt" | head -40
rm -rf $V
