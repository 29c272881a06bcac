# One device call: kern serve against transformers serve on the same HTTP workload
# (benchmarks/serve.py: 256 streamed chat requests, 512-token prompts sharing a 256-token system
# prompt, 128 output tokens, concurrency 32 then 128), on a seeded random Llama-3.2-1B-shaped
# checkpoint made here. Logs and one JSON summary land under $OUT; the summary is also printed.
# benchmarks/gpu.py runs it with the carried wheels installed and kern installed from this tree:
#
#   run(command="python3 benchmarks/gpu.py --preset serve", carry=[".whl"], timeout_s=600)
: "${OUT:?run through benchmarks/gpu.py --preset serve (it sets OUT, PYTHONPATH and KERN_CACHE)}"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $OUT/gpu.txt
CKPT=/tmp/serve-ckpt
WORK="--requests ${REQUESTS:-256} --prompt 512 --shared 256 --output 128 --concurrency ${CONC:-32,128}"

timeout 90 python3 -c "from kern_models.common.random_checkpoint import make; make('llama-3.2-1b', '$CKPT', device='cuda')" \
  > $OUT/checkpoint.log 2>&1 || { tail -5 $OUT/checkpoint.log; exit 1; }
python3 benchmarks/serve.py --prepare $CKPT

up() {  # wait for $1/health (at most $2 seconds) while process $3 lives
  for _ in $(seq 1 $2); do
    python3 -c "import sys, urllib.request; urllib.request.urlopen(sys.argv[1] + '/health', timeout=2)" "$1" \
      2> /dev/null && return 0
    kill -0 $3 2> /dev/null || return 1
    sleep 1
  done
  return 1
}

stop() {  # SIGTERM (uvicorn shuts down gracefully), then wait for the server to go
  kill -TERM $1 2> /dev/null
  for _ in $(seq 1 20); do kill -0 $1 2> /dev/null || return 0; sleep 1; done
  kill -KILL $1 2> /dev/null
}

# kern: the load builds the cubins and captures every decode graph before it listens.
python3 -m kern.cli serve $CKPT --target cuda --port 8100 --context 1024 --memory 8G \
  > $OUT/kern_serve.log 2>&1 &
KERN=$!
if up http://127.0.0.1:8100 ${KERN_UP_S:-130} $KERN; then
  timeout ${KERN_BENCH_S:-110} python3 benchmarks/serve.py --url http://127.0.0.1:8100 --label kern $WORK \
    > $OUT/kern.jsonl 2> $OUT/kern_bench.log
  python3 -c "import urllib.request; print(urllib.request.urlopen('http://127.0.0.1:8100/metrics').read().decode())" \
    > $OUT/kern_metrics.txt
else
  echo "kern serve did not come up"; tr '\r' '\n' < $OUT/kern_serve.log | tail -15
fi
stop $KERN

# transformers serve: /v1/models fails unless the hub cache folder exists (LESSONS.md, Serving).
mkdir -p ~/.cache/huggingface/hub
HF_HUB_OFFLINE=1 transformers serve --continuous-batching --cb-use-cuda-graph $CKPT --port 8101 \
  > $OUT/transformers_serve.log 2>&1 &
HF=$!
if up http://127.0.0.1:8101 ${HF_UP_S:-80} $HF; then
  timeout ${HF_BENCH_S:-110} python3 benchmarks/serve.py --url http://127.0.0.1:8101 --model $CKPT --label transformers \
    $WORK > $OUT/transformers.jsonl 2> $OUT/transformers_bench.log
else
  echo "transformers serve did not come up"; tail -15 $OUT/transformers_serve.log
fi
stop $HF

# The API process's own cost a token on this host's CPU: the real server over a fake engine
# (benchmarks/serve_cpu.py), 128 streams at 4 ms steps (32,000 tok/s asked) and 32 at 2 ms (16,000).
# SERVE_CPU=0 skips it (a call short of time).
if [ "${SERVE_CPU:-1}" = 1 ]; then
  for a in "128 4" "32 2"; do set -- $a
    timeout ${CPU_BENCH_S:-45} python3 benchmarks/serve_cpu.py --concurrency $1 --step-ms $2 >> $OUT/serve_cpu.jsonl \
      2>> $OUT/serve_cpu.log
  done
  cat $OUT/serve_cpu.jsonl
fi

python3 - "$OUT" <<'EOF' | tee $OUT/summary.json
import json, sys
from pathlib import Path

out = Path(sys.argv[1])
rows = []
for label in ("kern", "transformers"):
    p = out / f"{label}.jsonl"
    if not p.is_file() or not p.read_text().strip():
        rows.append({"label": label, "error": f"no result (see {label}_*.log)"})
        continue
    for r in map(json.loads, p.read_text().splitlines()):
        rows.append({"label": label, "concurrency": r["concurrency"], "completed": r["completed"],
                     "failed": r["failed"], "req_s": r["request_throughput"], "out_tok_s": r["output_throughput"],
                     "ttft_ms": r["ttft_ms"], "tpot_ms": r["tpot_ms"], "itl_ms": r["itl_ms"],
                     "client_cpu": r.get("client_cpu"),
                     **({"failures": r["failures"]} if r["failed"] else {})})
print(json.dumps({"gpu": (out / "gpu.txt").read_text().strip(), "rows": rows}).replace('}, {"label"', '},\n {"label"'))
EOF
