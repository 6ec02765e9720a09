#!/usr/bin/env bash
# Balancing policies at 4, 64 and 512 ranks in the virtual-time simulator,
# and the share of dummy steps expert parallelism costs.
source "$(dirname "$0")/common.sh"
work=(--input-len lognormal:1000,1 --input-max 16384 --output-len lognormal:200,1 --output-max 2048 --seed 7)
for ranks in 4 64 512; do
  # Arrivals over about 20 s of virtual time at 80% load, and at least
  # 8000 requests, so that a p99 rests on 80 of them.
  requests=$((ranks * 150 > 8000 ? ranks * 150 : 8000))
  "$DPBENCH" --simulate --ranks "$ranks" --policy all --load 0.5,0.8,0.95 "${work[@]}" --requests "$requests" --quiet \
    --out "$OUT/sim-$ranks.json" --plot "docs/bench/sim-$ranks.svg" --title "simulated, $ranks ranks"
done
# Mooncake's conversation trace: long shared prefixes (prefix affinity).
if [ -f ../shared/data/mooncake-fast25/conversation_trace.jsonl ]; then
  "$DPBENCH" --simulate --ranks 16 --policy all --load 0.5,0.8,0.95 --trace ../shared/data/mooncake-fast25/conversation_trace.jsonl \
    --requests 12031 --quiet --out "$OUT/sim-mooncake-16.json" --plot docs/bench/sim-mooncake-16.svg --title "simulated, 16 ranks, Mooncake trace"
fi
# Expert parallelism: the share of rank-steps that are dummy steps.
for ranks in 8 32 64; do
  "$DPBENCH" --simulate --ranks "$ranks" --sim-profile qwen3-30b-a3b-h200 --expert-parallel --policy live,round-robin \
    --load 0.1,0.5,0.8 "${work[@]}" --requests $((ranks * 200)) --quiet --out "$OUT/sim-ep-$ranks.json"
done
