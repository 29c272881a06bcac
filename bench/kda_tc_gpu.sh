# One device call for the default build's Kimi kernels (issue 38 items 1 and 4; written without a
# GPU): the GPU tests of kda_tc.cu (bits whole / cut / decoded / alone / batched for both
# invariant forms, against float64, the numpy model and kda_tokens) and of mla_tc.cu (the
# attention's split, the up-projections: alone = in a tile, against the model and the CUDA-core
# kernels), the kernels' byte-for-byte checks, the timing probe (tokens / chunked / tc, prefill
# 4 x 512 and 1 x 2,048, decode 64 at 32 heads of 128), then kern test of the tiny model's
# builds against the cpu reference with the planted bugs, and the whole model's invariance test.
# BEFORE=.oldkda: that folder's files (laid out as in the tree: the family's kernels at an earlier
# commit, e.g. `git show REV:PATH` for table.py, cubins.sha256, cubins/kda_tc.cubin) laid over a
# copy of this tree, and the probe run there too (\$OUT/before/kda_tc.json): the change's speed-up
# measured in the same call. JUDGE=0 leaves out the kern test / whole-model step (the suite has it).
# From the repository root, $OUT set, .whl carried (as bench/session_gpu.sh).
source bench/device_env.sh
timeout "${TESTS_S:-180}" python3 -m pytest -m gpu -v -s -p no:cacheprovider -rfEs \
  tests/kimi_linear/test_cuda_gpu_kda_tc.py tests/kimi_linear/test_cuda_gpu_invariant.py \
  tests/kimi_linear/test_cuda_gpu_mla_tc.py tests/kimi_linear/test_cuda_gpu_mla_proj.py > "$OUT/kda_tc_tests.txt" 2>&1
grep -E "(PASSED|FAILED|ERROR)( |$)|^=+ .*(passed|failed|error)" "$OUT/kda_tc_tests.txt" | tail -40
grep -E "worst \|err\|" "$OUT/kda_tc_tests.txt" | head -6
timeout "${PROBE_S:-80}" python3 -m bench.probes.kda_tc > "$OUT/kda_tc_probe.txt" 2>&1; tail -40 "$OUT/kda_tc_probe.txt"
if [ -n "${BEFORE:-}" ]; then
  rm -rf /tmp/before /tmp/kern-before && mkdir -p /tmp/before "$OUT/before" \
    && cp -a $(ls -A | grep -v -e '^vp' -e '^\.smp') /tmp/before/ && cp -a "$BEFORE"/. /tmp/before/ \
    && python3 -m pip install -q --no-index --no-deps --no-build-isolation --no-cache-dir --target /tmp/kern-before \
      /tmp/before >> "$OUT/pip.log" 2>&1 \
    && (cd /tmp/before && OUT="$OUT/before" PYTHONPATH=/tmp/kern-before:/tmp/site timeout "${PROBE_S:-80}" \
      python3 -m bench.probes.kda_tc > "$OUT/before/kda_tc_probe.txt" 2>&1)
  python3 - "$OUT" <<'PY'
import json, sys
now, was = (json.load(open(f"{sys.argv[1]}/{d}kda_tc.json")) for d in ("", "before/"))
for case, v in now.items():
    if isinstance(v, dict) and "tc" in v:
        print(f"{case}: tc {v['tc']['ms']} ms, before {was[case]['tc']['ms']} ms")
PY
fi
[ "${JUDGE:-1}" = 0 ] && exit 0
timeout "${JUDGE_S:-220}" python3 -m pytest -m gpu -v -s -p no:cacheprovider -rfEs \
  tests/kimi_linear/test_cuda.py tests/kimi_linear/test_invariance_gpu.py > "$OUT/kda_tc_judge.txt" 2>&1
grep -E "(PASSED|FAILED|ERROR)( |$)|^=+ .*(passed|failed|error)" "$OUT/kda_tc_judge.txt" | tail -20
