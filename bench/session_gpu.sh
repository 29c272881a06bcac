# One device call for a session's close: the whole GPU suite on this tree, then what the
# tensor-core issue measures end to end (prefill of 2,040 tokens and decode at 1 / 16 / 64
# sequences on the default, batch-invariant build: bench/decode.py), the gemv decode kernel
# against a copy of an earlier one (tests/cuda/_variants/<label>/, if present) and the GEMM's
# probe variants (bench/probes/gemm_variants.py, if bench/probes/var_* exist).
# From the repository root, $OUT set, .whl carried (the wheels the image lacks).
source bench/device_env.sh
# -v: a test's verdict is on its own line as it ends, so a run cut by the timeout still names its failures.
# One process a folder of tests: an engine a test drops keeps its device memory until the process
# ends (kern frees device buffers only when told), and on an 80 GB card one process running every
# folder's engines ran out of it (2026-12-06, docs/perf-history.md); a folder's own tests fit.
END=$(( $(date +%s) + ${SUITE_S:-420} ))
: > "$OUT/suite.txt"
# SUITE_FROM=tests/qwen3_moe/: start at that folder (a second call finishing a suite the first cut).
for d in $(ls -d tests/*/ | grep -v __pycache__ | sort); do
  [[ -n "${SUITE_FROM:-}" && "$d" < "$SUITE_FROM" ]] && continue
  left=$(( END - $(date +%s) ))
  [ "$left" -gt 5 ] || { echo "the suite's time ran out before $d" | tee -a "$OUT/suite.txt"; break; }
  echo "=== $d" >> "$OUT/suite.txt"
  timeout "$left" python3 -m pytest -m gpu -v -p no:cacheprovider -rfEs --basetemp="/tmp/suite-$(basename $d)" "$d" \
    >> "$OUT/suite.txt" 2>&1
  rc=$?; [ "$rc" = 5 ] || [ "$rc" = 0 ] || echo "$d: pytest exit $rc" | tee -a "$OUT/suite.txt"  # 5: no GPU test there
done
grep -E "(FAILED|ERROR)( |$)" "$OUT/suite.txt" | tail -14
python3 - "$OUT/suite.txt" <<'PY'
import re, sys
text = open(sys.argv[1]).read()
n = {k: len(re.findall(rf" {k.upper()}( |$)", text, re.M)) for k in ("passed", "failed", "skipped", "error")}
print("the GPU suite, every folder:", ", ".join(f"{v} {k}" for k, v in n.items()))
PY
echo "verdicts: $(grep -cE ' (PASSED|FAILED|SKIPPED|ERROR)' "$OUT/suite.txt")"
[ "${DECODE_S:-120}" != 0 ] && timeout "${DECODE_S:-120}" python3 bench/decode.py --shapes llama-3.2-1b --batch 1,16,64 > "$OUT/decode.json" \
  2> "$OUT/decode.err" || tail -3 "$OUT/decode.err"
python3 -c "
import json,sys
for l in open('$OUT/decode.json'):
    l=l.strip()
    if l.startswith('{'): print(l[:1500])" 2>/dev/null
if ls bench/probes/var_* > /dev/null 2>&1; then
  timeout 90 python3 -m bench.probes.gemm_variants 2>&1 | tail -4
fi
if [ -d tests/cuda/_variants ]; then
  timeout 120 python3 -m tests.cuda.bench_cuda_kernels bench_gemv \
    > "$OUT/gemv.txt" 2>&1
  grep -E "^gemv (llama-1b|smollm2)" "$OUT/gemv.txt" | head -16
fi
