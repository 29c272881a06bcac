# One device call for a session's close: the whole GPU suite on this tree, then what the
# tensor-core issue measures end to end (prefill of 2,040 tokens and decode at 1 / 16 / 64
# sequences on the default, batch-invariant build: bench/decode.py), the gemv decode kernel
# against a copy of an earlier one (tests/cuda/_variants/<label>/, if present) and the GEMM's
# probe variants (bench/probes/gemm_variants.py, if bench/probes/var_* exist).
# From the repository root, $OUT set, .whl carried (the wheels the image lacks).
source bench/device_env.sh
# -v: a test's verdict is on its own line as it ends, so a run cut by the timeout still names its failures
timeout "${SUITE_S:-420}" python3 -m pytest -m gpu -v -p no:cacheprovider -rfEs tests > "$OUT/suite.txt" 2>&1
grep -E "(FAILED|ERROR)( |$)|^=+ .*(passed|failed)" "$OUT/suite.txt" | tail -14
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
