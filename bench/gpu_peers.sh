# One device call: bench/decode.py with the compiled peer too (transformers, static cache,
# torch.compile reduce-overhead), no prefill timing. Compiling takes most of the call.
source bench/gpu_env.sh || exit 1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $OUT/gpu.txt
timeout 540 python3 bench/decode.py --batch 1,16 --new 128 --prefill 0 --compiled > $OUT/decode_peers.log 2>&1
grep '^{' $OUT/decode_peers.log | grep -v '"gpu"'; tail -3 $OUT/decode_peers.log
