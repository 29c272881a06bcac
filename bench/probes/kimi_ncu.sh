# Hardware counters of Kimi-Linear's heaviest launches, for the next kernel change to aim at
# (issue 38: what limits kda_tc at ~12 TFLOP/s and mla_attend_x_wg at 180, of the H100's ~800):
# Nsight Compute's speed of light, occupancy, warp stall reasons, memory traffic and the
# launch's registers and shared memory, over the probes' own launches (bench/probes/kda_tc.py,
# mla_tc.py). From the repository root on the device, $OUT set, .whl carried; a few minutes.
# `--clock-control none`: the device notes (METHOD.md) leave the clocks alone; each kernel's first
# three launches only (the probes repeat each launch in a graph).
#
#   source bench/device_env.sh; bash bench/probes/kimi_ncu.sh
set -u
: "${OUT:?set OUT}"
NCU="ncu --clock-control none --launch-count ${NCU_LAUNCHES:-3} --section SpeedOfLight --section LaunchStats
     --section Occupancy --section WarpStateStats --section MemoryWorkloadAnalysis --section SchedulerStats"
command -v ncu > /dev/null || { echo "no ncu on this machine"; exit 1; }
# KDA's chunked recurrence (the prefill of 4 x 512 and one of 2,048) and its one-row decode step
timeout ${NCU_S:-240} $NCU -k 'regex:^kda_tc(_decode|_prep)?$' python3 -m bench.probes.kda_tc > "$OUT/ncu_kda_tc.txt" 2>&1
# MLA's prompt rows in the expanded form on wgmma, and the absorbed decode
timeout ${NCU_S:-240} $NCU -k 'regex:^mla_attend_(x_wg|tc_decode)$' python3 -m bench.probes.mla_tc > "$OUT/ncu_mla.txt" 2>&1
for f in "$OUT"/ncu_*.txt; do
  echo "== $f"
  grep -E '^  [a-z_]+.*\(|Duration|Compute \(SM\) Throughput|Memory Throughput|DRAM Throughput|Registers Per Thread|Achieved Occupancy|Issue Slots Busy|No Eligible|Stall' "$f" | head -60
done
