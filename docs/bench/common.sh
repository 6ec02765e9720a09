# Shared by the benchmark scripts: builds the binaries and cleans up the
# processes a script starts.
set -euo pipefail
cd "$(dirname "$0")/../.."
export PATH="/usr/local/go/bin:$PATH"
OUT=${OUT:-docs/bench/results}
mkdir -p "$OUT" /tmp/dpnode-bench
# BUILT=1: the binaries are already there (a script that runs others builds once).
if [ "${BUILT:-0}" != 1 ]; then
  go build -o /tmp/dpnode-bench/dpnode ./cmd/dpnode
  go build -o /tmp/dpnode-bench/dpbench ./cmd/dpbench
fi
DPNODE=/tmp/dpnode-bench/dpnode
DPBENCH=/tmp/dpnode-bench/dpbench
PIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
}
trap cleanup EXIT
# wait_http URL: until it answers.
wait_http() {
  for _ in $(seq 100); do
    curl -fsS -o /dev/null "$1" 2>/dev/null && return 0
    sleep 0.2
  done
  echo "no answer from $1" >&2
  return 1
}
# stop_all: stops what was started so far.
stop_all() {
  cleanup
  PIDS=()
}
