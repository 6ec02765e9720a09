#!/usr/bin/env bash
# What a request feature costs: output tok/s of one dpnode of two llama.cpp
# CPU ranks (the trace benchmark's model: random weights, Llama 3's 128k
# vocabulary, 4 layers 256 wide), closed loop at CLIENTS clients, prompts of
# 256 tokens and 64 out, plain and with the feature; ROUNDS rounds, the two
# interleaved in each, every run on a fresh node. Needs make llamacpp.
#
#   bash docs/bench/feature-cost.sh NAME TEMPERATURE DPBENCH-FLAGS...
#
# writes $OUT/NAME/NAME-{plain,feature}-rN.json and NAME-table.md;
# logprobs-cpu.sh and structured-cpu.sh call it.
source "$(dirname "$0")/common.sh"
NAME=$1 TEMPERATURE=$2
shift 2
ROUNDS=${ROUNDS:-3}
CLIENTS=${CLIENTS:-8}
REQUESTS=${REQUESTS:-160}
OUT=$OUT/$NAME
mkdir -p "$OUT"
[ -x bin/dpnode-llama-worker ] || { echo "run make llamacpp first" >&2; exit 1; }
export DPNODE_LLAMACPP_WORKER=$PWD/bin/dpnode-llama-worker
MODEL=/tmp/dpnode-bench/tracemodel.gguf
"$DPNODE" testmodel --vocab .llamacpp/src/models/ggml-vocab-llama-bpe.gguf --whole-characters \
  --embedding 256 --layers 4 --feed-forward 768 --heads 4 --kv-heads 2 --out "$MODEL" >/dev/null

for round in $(seq "$ROUNDS"); do
  for target in plain feature; do
    "$DPNODE" join --engine llamacpp --model "$MODEL" --host 127.0.0.1 --port 18000 --bind 127.0.0.1:17946 \
      --data-parallel-rpc-port 0 --gpus 2 --threads 1 --kv-cache-dtype float16 --kv-cache-memory-bytes 512MiB \
      --max-num-seqs 16 --max-model-len 1024 --log-level warn 2>>/tmp/dpnode-bench/dpnode.log & PIDS+=($!)
    for _ in $(seq 300); do curl -fsS -o /dev/null http://127.0.0.1:18000/v1/models 2>/dev/null && break; sleep 0.2; done
    extra=()
    [ "$target" = feature ] && extra=("$@")
    "$DPBENCH" --url http://127.0.0.1:18000 --metrics-url none --concurrency "$CLIENTS" --requests "$REQUESTS" \
      --input-len fixed:256 --output-len fixed:64 --temperature "$TEMPERATURE" --quiet --label "$target" "${extra[@]}" \
      --out "$OUT/$NAME-$target-r$round.json"
    stop_all
  done
done

python3 - "$OUT" "$NAME" "$ROUNDS" <<'PY' | tee "$OUT/$NAME-table.md"
import json, statistics, sys
out, name, rounds = sys.argv[1], sys.argv[2], int(sys.argv[3])
def runs(target):
    return [json.load(open(f"{out}/{name}-{target}-r{r}.json"))["runs"][0] for r in range(1, rounds + 1)]
def fmt(xs, f="{:.0f}"):
    return f"{f.format(statistics.median(xs))} ({f.format(min(xs))}-{f.format(max(xs))})"
print("| target | output tok/s | TPOT p50 ms | TTFT p50 ms | failed |")
print("|---|---|---|---|---|")
med = {}
for t in ("plain", "feature"):
    rs = runs(t)
    tps = [r["output_token_throughput"] for r in rs]
    med[t] = statistics.median(tps)
    print(f"| {name if t == 'feature' else t} | {fmt(tps)} | {fmt([r['tpot_ms']['p50'] for r in rs], '{:.1f}')} | {fmt([r['ttft_ms']['p50'] for r in rs])} | {sum(r['failed'] for r in rs)} |")
print(f"\nwith {name} / without: output tok/s {med['feature'] / med['plain']:.2f}x")
PY
