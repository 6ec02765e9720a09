#!/usr/bin/env bash
# The goal row of balance.sh (80% load) three times, with three workloads
# of the same shape (seeds 7, 8, 9), at the same offered rate; the
# binaries are built once, so every round measures the same code.
set -euo pipefail
export GOTOOLCHAIN="${GOTOOLCHAIN:-go1.27.3}"
cd "$(dirname "$0")/../.."
mkdir -p /tmp/dpnode-bench
go build -o /tmp/dpnode-bench/dpnode ./cmd/dpnode
go build -o /tmp/dpnode-bench/dpbench ./cmd/dpbench
for seed in ${SEEDS:-7 8 9}; do
  BUILT=1 CAPACITY=${CAPACITY:-36.87} LOADS=0.8 SEED=$seed TAG=s$seed bash docs/bench/balance.sh
done
