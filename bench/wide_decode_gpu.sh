# One device call for the wide decode's projections (docs/perf-history.md): where the
# gemv decode program's bound should sit in the default build, and whether
# bench/probes/wg_cluster.patch (the split's partials summed through the cluster's shared
# memory) is faster than the split of before, with the same bytes. From the repository root,
# $OUT set, .whl carried:
#
#   run(command="bash bench/wide_decode_gpu.sh", carry=[".whl"], timeout_s=600)
#
# 1. bench/crossover.py on this tree, the gemv program up to 32 sequences beside the wide one
#    (the default bound, 8, was measured against the cuBLASLt wide program): $OUT/crossover.jsonl
# 2. this tree's cubins kept as "before", the patch applied, the patched tree installed (its
#    cubins rebuilt by nvcc), then the probe (bench/probes/wg_split.py: split before / now /
#    unsplit, same bytes?): $OUT/wg_split.txt
# 3. the emulated check and the GPU bit-for-bit tests of the gemm twins on the patched tree:
#    $OUT/tests.txt
: "${OUT:?set OUT, the folder whose files come back from the device call}"
source bench/device_env.sh
timeout "${CROSS_S:-150}" python3 bench/crossover.py --seqs 32 --reach 1024 --batch 8,12,16,24,32 --repeats 10 \
  > "$OUT/crossover.jsonl" 2> "$OUT/crossover.err" || tail -3 "$OUT/crossover.err"
tail -1 "$OUT/crossover.jsonl"
python3 -c "from pathlib import Path; from kern_models.llama.kernels.cuda import CUBINS; CUBINS.provide(Path('/tmp/before'))"
{ patch -p1 < bench/probes/wg_cluster.patch || git apply bench/probes/wg_cluster.patch; } > "$OUT/patch.log" 2>&1 \
  || { echo "the patch did not apply"; tail -3 "$OUT/patch.log"; exit 1; }
source bench/device_env.sh > /dev/null
timeout "${PROBE_S:-200}" python3 -m bench.probes.wg_split --before /tmp/before > "$OUT/wg_split.txt" 2>&1
cat "$OUT/wg_split.txt" | tail -34
timeout "${TESTS_S:-150}" python3 -m pytest -q -p no:cacheprovider -rfE tests/cuda/test_wg_emulated.py \
  tests/cuda/test_cuda_gpu_invariant.py -m "gpu or not gpu" > "$OUT/tests.txt" 2>&1
tail -3 "$OUT/tests.txt"
