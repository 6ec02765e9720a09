#!/usr/bin/env bash
# Runtime overhead: dpnode with a zero-cost executor (two ranks) against a
# bare Go HTTP server streaming the same bytes, loaded by dpbench from the
# same machine, streamed and whole; ROUNDS (default 3) times, one server
# after the other. BEFORE=/path/to/an/older/dpnode adds that build, in the
# same rounds.
source "$(dirname "$0")/common.sh"
REQUESTS=${REQUESTS:-20000}
ROUNDS=${ROUNDS:-3}
"$DPNODE" join --host 127.0.0.1 --port 18000 --bind 127.0.0.1:17946 --data-parallel-rpc-port 0 \
  --sim-time-scale 0 --log-level warn 2>>/tmp/dpnode-bench/dpnode.log & PIDS+=($!)
"$DPBENCH" bare --listen 127.0.0.1:18001 >/dev/null & PIDS+=($!)
if [ -n "${BEFORE:-}" ]; then
  "$BEFORE" join --host 127.0.0.1 --port 18002 --bind 127.0.0.1:17947 --data-parallel-rpc-port 0 \
    --sim-time-scale 0 --log-level warn 2>>/tmp/dpnode-bench/dpnode-before.log & PIDS+=($!)
  wait_http http://127.0.0.1:18002/health
fi
wait_http http://127.0.0.1:18000/health
wait_http http://127.0.0.1:18001/v1/models
common=(--concurrency 16,64 --requests "$REQUESTS" --input-len fixed:16 --output-len fixed:16 --quiet)
for round in $(seq "$ROUNDS"); do
  for mode in stream no-stream; do
    flag=(); [ "$mode" = no-stream ] && flag=(--no-stream)
    "$DPBENCH" --url http://127.0.0.1:18001 --metrics-url none --label "bare, $mode, round $round" "${flag[@]}" "${common[@]}" --out "$OUT/overhead-bare-$mode-r$round.json"
    if [ -n "${BEFORE:-}" ]; then
      "$DPBENCH" --url http://127.0.0.1:18002 --label "before, $mode, round $round" "${flag[@]}" "${common[@]}" --out "$OUT/overhead-before-$mode-r$round.json"
    fi
    "$DPBENCH" --url http://127.0.0.1:18000 --label "dpnode, $mode, round $round" "${flag[@]}" "${common[@]}" --out "$OUT/overhead-dpnode-$mode-r$round.json"
  done
done
