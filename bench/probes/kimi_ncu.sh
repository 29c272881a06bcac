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
NCU="ncu --clock-control none --launch-count ${NCU_LAUNCHES:-3} --kill yes --section SpeedOfLight --section LaunchStats
     --section Occupancy --section WarpStateStats --section MemoryWorkloadAnalysis --section SchedulerStats"
command -v ncu > /dev/null || { echo "no ncu on this machine"; exit 1; }
# each kernel its own run (--launch-count counts the launches the filter matches, all kernels
# together): KDA's chunked recurrence, its scores, its one-row decode step (the kda_tc probe's
# cases), then MLA's prompt rows on wgmma and its absorbed decode (the mla_tc probe's)
# (--kill yes: the probe ends once its launches are profiled; mla_attend_x_wg's case comes last in
# its probe, after a few minutes of the others: KERNELS picks which, for a call's 600 s)
for k in ${KERNELS:-kda_tc kda_tc_prep kda_tc_decode mla_attend_tc_decode mla_attend_x_wg}; do
  case $k in kda*) probe=bench.probes.kda_tc ;; *) probe=bench.probes.mla_tc ;; esac
  timeout ${NCU_S:-240} $NCU -k "regex:^$k\$" python3 -m $probe > "$OUT/ncu_$k.txt" 2>&1
done
for f in "$OUT"/ncu_*.txt; do
  echo "== $f"
  grep -E '^  [a-z_]+.*\(|Duration|Compute \(SM\) Throughput|Memory Throughput|DRAM Throughput|Registers Per Thread|Achieved Occupancy|Issue Slots Busy|No Eligible|Stall' "$f" | head -60
done
