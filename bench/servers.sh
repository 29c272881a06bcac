# Shell helpers the GPU serving benchmarks source (bench/serve_gpu.sh, moe_serve_gpu.sh).

up() {  # wait for $1/health (at most $2 seconds, by the clock: each poll's python start-up counts) while process $3 lives
  local until=$(($(date +%s) + $2))
  while [ $(date +%s) -lt $until ]; do
    python3 -c "import sys, urllib.request; urllib.request.urlopen(sys.argv[1] + '/health', timeout=2)" "$1" \
      2> /dev/null && return 0
    kill -0 $3 2> /dev/null || return 1
    sleep 0.2
  done
  return 1
}

stop() {  # SIGTERM (uvicorn shuts down gracefully), then wait for the server to go
  kill -TERM $1 2> /dev/null
  for _ in $(seq 1 20); do kill -0 $1 2> /dev/null || return 0; sleep 1; done
  kill -KILL $1 2> /dev/null
}

served() {  # $1 label, $2 url, $3 seconds, $4 pid, $5 start time (date +%s.%N), $6 folder, $7 log:
            # wait for the server, record its start-up in $6/$1_startup.json and `measure` it (the
            # sourcing script's), or say that it did not come up with the log's end
  if up $2 $3 $4; then
    echo "{\"label\": \"$1\", \"startup_s\": $(python3 -c "import time; print(round(time.time() - $5, 1))")}" \
      | tee $6/$1_startup.json
    measure $1 $2
  else
    echo "$1 did not come up"; tr '\r' '\n' < $7 | tail -15
  fi
}
