#!/usr/bin/env bash
# What log-probabilities cost (feature-cost.sh): greedy, with and without
# logprobs and TOP top tokens each.
#
#   bash docs/bench/logprobs-cpu.sh     # writes to $OUT/logprobs (docs/bench/results/logprobs)
exec bash "$(dirname "$0")/feature-cost.sh" logprobs 0 --logprobs "${TOP:-5}"
