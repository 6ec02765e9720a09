#!/usr/bin/env bash
# What structured output costs (feature-cost.sh): sampled at temperature 1,
# with and without the JSON schema of structured-schema.json. The requests
# run to their 64 tokens (ignore_eos): once the grammar is done it allows
# only the end token, drawn through a mask of the whole vocabulary, so
# every token of the run is constrained.
#
#   bash docs/bench/structured-cpu.sh   # writes to $OUT/structured (docs/bench/results/structured)
exec bash "$(dirname "$0")/feature-cost.sh" structured 1 --json-schema "$(dirname "$0")/structured-schema.json"
