#!/usr/bin/env bash
# Bursts: the same mean rate (80% of capacity, 16 simulated ranks), with
# requests arriving one by one (Poisson) or 200 at the same instant, as
# vLLM's tests send them. Snapshot-based balancing (vllm) sees none of a
# burst's own picks until the next snapshot; live counts them. Three seeds.
source "$(dirname "$0")/common.sh"
work=(--input-len lognormal:1000,1 --input-max 16384 --output-len lognormal:200,1 --output-max 2048 --requests 8000)
for burst in 1 200; do
  for seed in 1 2 3; do
    "$DPBENCH" --simulate --ranks 16 --policy live,vllm,round-robin --load 0.8 --burst "$burst" --seed "$seed" "${work[@]}" \
      --quiet --out "$OUT/bursts-$burst-s$seed.json"
  done
done
