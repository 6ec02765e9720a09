#!/usr/bin/env bash
# Growing and shrinking under load, internal mode, --data-parallel-size
# auto, two simulated ranks per node (llama-3.1-8b-h100, real-time steps):
# an API node and one headless node serve a constant-rate load for 110 s;
# at 15 s a third node joins, at 30 s a fourth; at 45 s the third leaves
# (POST /admin/leave), and 5 s after it has exited the fourth (SIGTERM
# with --leave-on-terminate). A leave drains first: it lasts as long as
# the longest request the node holds.
# For each join, the time from `dpnode join` to the first request served on
# the new ranks; for each leave, from the request to the node's exit. TTFT
# per phase against the steady state before the first join, and over time
# (docs/bench/elastic.svg, from the first run). REPEATS runs (default 3);
# RATE requests/s (default 29: 80% of four ranks' capacity, 40% of eight).
source "$(dirname "$0")/common.sh"
# The admin routes are off without a key; the nodes read it from here.
export DPNODE_ADMIN_API_KEY="bench-admin-$RANDOM$RANDOM"
REPEATS=${REPEATS:-3}
RATE=${RATE:-29}
A=127.0.0.71
node() { # IP ARGS...: starts dpnode on IP, echoes its PID
  local ip=$1; shift
  "$DPNODE" join --bind "$ip:7946" --data-parallel-rpc-port 29550 --gossip-profile local \
    --data-parallel-size auto --data-parallel-size-local 2 --sim-time-scale 1 --drain-timeout 30s "$@" \
    >"/tmp/dpnode-bench/elastic-$ip.log" 2>&1 &
  echo $!
}
headless() { local ip=$1; shift; node "$ip" --headless --host "$ip" --metrics-port 9000 --seeds "$A:7946" "$@"; }
now_ms() { date +%s%3N; }
strip_requests() { # FILE: drops the per-request timings from a dpbench result
  python3 -c "
import json, sys
d = json.load(open(sys.argv[1]))
for r in d['runs']:
    r.pop('requests', None)
json.dump(d, open(sys.argv[1], 'w'), indent=2)
print(file=open(sys.argv[1], 'a'))" "$1"
}
# served IP RANK...: until a request finished on one of the ranks, as the
# API node counts them.
served() {
  for _ in $(seq 2000); do
    for r in "$@"; do
      if curl -fsS "http://$A:8000/metrics" | grep -E "^vllm:request_success_total\{engine=\"$r\"" | awk '{s+=$2} END {exit !(s>0)}'; then
        return 0
      fi
    done
    sleep 0.02
  done
  echo "no request served on ranks $*" >&2
  return 1
}
ranks_of() { # IP: the ranks the roster gives the node at IP, space-separated
  curl -fsS "http://$A:8000/v1/cluster" | python3 -c "
import json, sys
for h in json.load(sys.stdin)['size']['holds']:
    if h['node'] == '$1:7946':
        print(' '.join(str(r) for r in range(h['first_rank'], h['first_rank'] + h['ranks'])))"
}
join() { # IP LABEL [ARGS...]: the join, timed to its first request served
  local ip=$1 label=$2; shift 2
  local t0 pid
  t0=$(now_ms)
  echo "$t0 $label joins" >>"$EVENTS"
  pid=$(headless "$ip" "$@")
  PIDS+=("$pid")
  local ranks=""
  for _ in $(seq 500); do ranks=$(ranks_of "$ip"); [ -n "$ranks" ] && break; sleep 0.02; done
  # shellcheck disable=SC2086
  served $ranks
  local t1
  t1=$(now_ms)
  echo "$t1 $label serves" >>"$EVENTS"
  echo "join $label: ranks $ranks, first request served after $((t1 - t0)) ms" | tee -a "$SUMMARY"
  eval "PID_$label=$pid"
}
leave() { # LABEL HOW: the leave, timed to the node's exit
  local label=$1 how=$2 pidvar="PID_$1" t0
  t0=$(now_ms)
  echo "$t0 $label leaves" >>"$EVENTS"
  if [ "$how" = http ]; then
    curl -fsS -X POST -H "Authorization: Bearer $DPNODE_ADMIN_API_KEY" "http://$3:9000/admin/leave" >/dev/null
  else
    kill -TERM "${!pidvar}"
  fi
  local t1
  while kill -0 "${!pidvar}" 2>/dev/null; do sleep 0.01; done
  t1=$(now_ms)
  echo "leave $label ($how): exited after $((t1 - t0)) ms" | tee -a "$SUMMARY"
}

for run in $(seq "$REPEATS"); do
  EVENTS="$OUT/elastic-events-$run.txt"
  SUMMARY="$OUT/elastic-summary-$run.txt"
  : >"$EVENTS"
  : >"$SUMMARY"
  PIDS+=("$(node $A --host $A --port 8000 --data-parallel-lb internal)")
  wait_http "http://$A:8000/health"
  PIDS+=("$(headless 127.0.0.72)")
  for _ in $(seq 100); do
    curl -fsS "http://$A:8000/v1/cluster" | grep -q '"data_parallel_size":4' && break
    sleep 0.1
  done
  "$DPBENCH" --url "http://$A:8000" --rate "$RATE" --requests 100000 --duration 110s --detail --quiet \
    --input-max 16384 --output-max 2048 \
    --out "$OUT/elastic-$run.json" >"$OUT/elastic-bench-$run.txt" &
  bench=$!
  sleep 15
  join 127.0.0.73 C
  sleep 13
  join 127.0.0.74 D --leave-on-terminate
  sleep 13
  leave C http 127.0.0.73
  sleep 5
  leave D sigterm
  wait "$bench"
  "$DPBENCH" timeline "$OUT/elastic-$run.json" --events "$EVENTS" | tee -a "$SUMMARY"
  if [ "$run" = 1 ]; then
    "$DPBENCH" timeline "$OUT/elastic-$run.json" --events "$EVENTS" --window 2s \
      --title "TTFT during scale-up (4 -> 6 -> 8 ranks) and scale-down (-> 4), ${RATE} req/s" --out docs/bench/elastic.svg >/dev/null
  else
    # Only the plotted run keeps every request's timings: the others'
    # phases are in the summary.
    strip_requests "$OUT/elastic-$run.json"
  fi
  # The nodes were started in subshells: wait for them by PID.
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${PIDS[@]}"; do while kill -0 "$p" 2>/dev/null; do sleep 0.1; done; done
  PIDS=()
done
