#!/usr/bin/env bash
# Overload: ten times what the server admits, at once, in a closed loop,
# while /health and /metrics are probed every 50 ms. Two ranks of the 8B
# profile in real time with --max-num-seqs 16 run 32 requests at once, and
# --max-pending-requests 32 lets 32 more wait: 64 admitted, 640 clients.
# Three runs of 10 s; the excess gets 503 with Retry-After (dpbench counts them as
# failed), the probes must all answer 200.
source "$(dirname "$0")/common.sh"
REQUESTS=${REQUESTS:-1000000}
DURATION=${DURATION:-10s}
"$DPNODE" join --host 127.0.0.1 --port 18000 --bind 127.0.0.1:17946 --data-parallel-rpc-port 0 \
  --max-num-seqs 16 --max-pending-requests 32 --log-level warn 2>>/tmp/dpnode-bench/dpnode.log & PIDS+=($!)
wait_http http://127.0.0.1:18000/health
for run in $(seq "${FIRST_RUN:-1}" "${LAST_RUN:-3}"); do
  "$DPBENCH" --url http://127.0.0.1:18000 --label "overload run $run" --concurrency 640 --requests "$REQUESTS" --duration "$DURATION" \
    --input-len fixed:64 --output-len fixed:32 --probe /health,/metrics --quiet --out "$OUT/overload-r$run.json"
done
