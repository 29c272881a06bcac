# One device call for the wide decode's projections (docs/perf-history.md 2026-12-05): where the
# gemv decode program's bound should sit in the default build, and the split GEMM against its
# unsplit twin (what SPLIT_BELOW_TILES picks). From the repository root, $OUT set, .whl carried:
#
#   run(command="bash bench/wide_decode_gpu.sh", carry=[".whl"], timeout_s=600)
#
# 1. bench/crossover.py on this tree, the gemv program up to 32 sequences beside the wide one:
#    $OUT/crossover.jsonl
# 2. PATCH=file: this tree's cubins kept as "before", the patch applied (a variant of
#    gemm_wg.cuh's split), the patched tree installed (its cubins rebuilt by nvcc); without it
#    both columns are this tree's
# 3. bench/probes/wg_split.py (split before / now / unsplit, same bytes?): $OUT/wg_split.txt
# 4. the emulated check and the GPU bit-for-bit tests of the gemm twins: $OUT/tests.txt
: "${OUT:?set OUT, the folder whose files come back from the device call}"
source bench/device_env.sh
timeout "${CROSS_S:-150}" python3 bench/crossover.py --seqs 32 --reach 1024 --batch 8,12,16,24,32 --repeats 10 \
  > "$OUT/crossover.jsonl" 2> "$OUT/crossover.err" || tail -3 "$OUT/crossover.err"
tail -1 "$OUT/crossover.jsonl"
BEFORE=
if [ -n "${PATCH:-}" ]; then
  python3 -c "from pathlib import Path; from kern_models.llama.kernels.cuda import CUBINS; CUBINS.provide(Path('/tmp/before'))"
  { patch -p1 < "$PATCH" || git apply "$PATCH"; } > "$OUT/patch.log" 2>&1 \
    || { echo "the patch did not apply"; tail -3 "$OUT/patch.log"; exit 1; }
  source bench/device_env.sh > /dev/null
  BEFORE="--before /tmp/before"
fi
timeout "${PROBE_S:-200}" python3 -m bench.probes.wg_split $BEFORE > "$OUT/wg_split.txt" 2>&1
tail -34 "$OUT/wg_split.txt"
timeout "${TESTS_S:-150}" python3 -m pytest -q -p no:cacheprovider -rfE tests/cuda/test_wg_emulated.py \
  tests/cuda/test_cuda_gpu_invariant.py -m "gpu or not gpu" > "$OUT/tests.txt" 2>&1
tail -3 "$OUT/tests.txt"
