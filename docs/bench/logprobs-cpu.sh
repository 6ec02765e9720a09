#!/usr/bin/env bash
# What log-probabilities cost: output tok/s of one dpnode of two llama.cpp
# CPU ranks (the trace benchmark's model: random weights, Llama 3's 128k
# vocabulary, 4 layers 256 wide), closed loop at CLIENTS clients, greedy,
# prompts of 256 tokens and 64 out, with and without logprobs and
# TOP top tokens each; ROUNDS rounds, the two interleaved in each, every run
# on a fresh node. Needs make llamacpp.
#
#   bash docs/bench/logprobs-cpu.sh     # writes to $OUT/logprobs (docs/bench/results/logprobs)
source "$(dirname "$0")/common.sh"
ROUNDS=${ROUNDS:-3}
CLIENTS=${CLIENTS:-8}
TOP=${TOP:-5}
REQUESTS=${REQUESTS:-160}
OUT=$OUT/logprobs
mkdir -p "$OUT"
[ -x bin/dpnode-llama-worker ] || { echo "run make llamacpp first" >&2; exit 1; }
export DPNODE_LLAMACPP_WORKER=$PWD/bin/dpnode-llama-worker
MODEL=/tmp/dpnode-bench/tracemodel.gguf
"$DPNODE" testmodel --vocab .llamacpp/src/models/ggml-vocab-llama-bpe.gguf --whole-characters \
  --embedding 256 --layers 4 --feed-forward 768 --heads 4 --kv-heads 2 --out "$MODEL" >/dev/null

for round in $(seq "$ROUNDS"); do
  for target in plain logprobs; do
    "$DPNODE" join --engine llamacpp --model "$MODEL" --host 127.0.0.1 --port 18000 --bind 127.0.0.1:17946 \
      --data-parallel-rpc-port 0 --gpus 2 --threads 1 --kv-cache-dtype float16 --kv-cache-memory-bytes 512MiB \
      --max-num-seqs 16 --max-model-len 1024 --log-level warn 2>>/tmp/dpnode-bench/dpnode.log & PIDS+=($!)
    for _ in $(seq 300); do curl -fsS -o /dev/null http://127.0.0.1:18000/v1/models 2>/dev/null && break; sleep 0.2; done
    extra=()
    [ "$target" = logprobs ] && extra=(--logprobs "$TOP")
    "$DPBENCH" --url http://127.0.0.1:18000 --metrics-url none --concurrency "$CLIENTS" --requests "$REQUESTS" \
      --input-len fixed:256 --output-len fixed:64 --temperature 0 --quiet --label "$target" "${extra[@]}" \
      --out "$OUT/logprobs-$target-r$round.json"
    stop_all
  done
done

python3 - "$OUT" "$ROUNDS" <<'PY' | tee "$OUT/logprobs-table.md"
import json, statistics, sys
out, rounds = sys.argv[1], int(sys.argv[2])
def runs(target):
    return [json.load(open(f"{out}/logprobs-{target}-r{r}.json"))["runs"][0] for r in range(1, rounds + 1)]
def fmt(xs, f="{:.0f}"):
    return f"{f.format(statistics.median(xs))} ({f.format(min(xs))}-{f.format(max(xs))})"
print("| target | output tok/s | TPOT p50 ms | TTFT p50 ms | failed |")
print("|---|---|---|---|---|")
med = {}
for t in ("plain", "logprobs"):
    rs = runs(t)
    tps = [r["output_token_throughput"] for r in rs]
    med[t] = statistics.median(tps)
    print(f"| {t} | {fmt(tps)} | {fmt([r['tpot_ms']['p50'] for r in rs], '{:.1f}')} | {fmt([r['ttft_ms']['p50'] for r in rs])} | {sum(r['failed'] for r in rs)} |")
print(f"\nwith logprobs / without: output tok/s {med['logprobs'] / med['plain']:.2f}x")
PY
