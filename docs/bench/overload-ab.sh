#!/usr/bin/env bash
# The overload benchmark (overload.sh) of a commit before a change and of
# the working tree, side by side: both built here, then run interleaved,
# one run of each per round, so that the machine's drift touches both
# alike. BEFORE is the commit (default HEAD~1); ROUNDS, default 3.
# Results in $OUT/overload-before/ and $OUT/overload-after/, and a line
# each of the rates served.
source "$(dirname "$0")/common.sh"
BEFORE=${BEFORE:-HEAD~1}
ROUNDS=${ROUNDS:-3}
tree=$(mktemp -d)
git worktree add -q --detach "$tree" "$BEFORE"
(cd "$tree" && go build -o /tmp/dpnode-bench/dpnode-before ./cmd/dpnode)
git worktree remove --force "$tree"
cp /tmp/dpnode-bench/dpnode /tmp/dpnode-bench/dpnode-after
for r in $(seq "$ROUNDS"); do
  for which in before after; do
    cp "/tmp/dpnode-bench/dpnode-$which" /tmp/dpnode-bench/dpnode
    BUILT=1 FIRST_RUN=$r LAST_RUN=$r OUT="$OUT/overload-$which" bash "$(dirname "$0")/overload.sh"
  done
done
cp /tmp/dpnode-bench/dpnode-after /tmp/dpnode-bench/dpnode
for which in before after; do
  python3 - "$OUT/overload-$which" "$ROUNDS" "$which" <<'PY'
import json, statistics, sys
out, rounds, which = sys.argv[1], int(sys.argv[2]), sys.argv[3]
rates = [json.load(open(f"{out}/overload-r{r}.json"))["runs"][0]["request_throughput"] for r in range(1, rounds + 1)]
print(f"{which}: served {statistics.median(rates):.1f} req/s ({min(rates):.1f}-{max(rates):.1f}), rounds {[round(x, 1) for x in rates]}")
PY
done
