#!/usr/bin/env bash
# Coordinator failover on three nodes in internal mode (the default lan
# gossip profile, real-time steps), a fresh cluster per try:
#   kill       kill -9 of the coordinator's node under load: time to a new
#              coordinator epoch, time until the requests on its rank move,
#              requests failed;
#   stop       SIGSTOP, left stopped: time to a new epoch;
#   pause      SIGSTOP for 2 s then SIGCONT: failovers that should not happen;
#   saturated  the coordinator's node pinned to one core with four busy
#              loops for 10 s: failovers that should not happen.
# TRIES (default 10) tries of each. The benchmark is BenchmarkFailover in
# node/failover_bench_test.go.
set -euo pipefail
export GOTOOLCHAIN="${GOTOOLCHAIN:-go1.27.3}"
cd "$(dirname "$0")/../.."
OUT=${OUT:-docs/bench/results}
TRIES=${TRIES:-10}
mkdir -p "$OUT"
go test ./node -run '^$' -bench '^BenchmarkFailover$' -benchtime "${TRIES}x" -timeout 60m | tee "$OUT/failover.txt"
