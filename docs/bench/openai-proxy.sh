#!/usr/bin/env bash
# The openai engine's own cost: one llama-server alone, against dpnode
# (--engine openai, tokenizing with the model's vocabulary) in front of
# that same server, at 1 and 32 clients in a closed loop, ROUNDS (default
# 6) rounds whose order alternates. Each run sends fresh prompts (a seed
# per round and target), so that the server's prompt cache finds nothing
# a run before it left; a connection per request (llama-server closes
# kept connections under its clients, which POSTs cannot be retried on).
# The model is trace-cpu.sh's; the server runs
# LLAMA_BUILD's llama-server (see trace-cpu.sh for how to build it).
source "$(dirname "$0")/common.sh"
ROUNDS=${ROUNDS:-6}
# Requests of a run of one client: its TTFT p50 is the median of these.
ONE_REQUESTS=${ONE_REQUESTS:-64}
LLAMA_BUILD=${LLAMA_BUILD:-$HOME/.cache/dpnode/llama-server-build}
LLAMA_SERVER=$LLAMA_BUILD/bin/llama-server
MODEL=/tmp/dpnode-bench/tracemodel.gguf
[ -x bin/dpnode-llama-worker ] || { echo "run make llamacpp first" >&2; exit 1; }
[ -x "$LLAMA_SERVER" ] || { echo "no llama-server in $LLAMA_BUILD (see trace-cpu.sh)" >&2; exit 1; }
export DPNODE_LLAMACPP_WORKER=$PWD/bin/dpnode-llama-worker
[ -f "$MODEL" ] || "$DPNODE" testmodel --vocab .llamacpp/src/models/ggml-vocab-llama-bpe.gguf --whole-characters \
  --embedding 256 --layers 4 --feed-forward 768 --heads 4 --kv-heads 2 --out "$MODEL" >/dev/null
"$LLAMA_SERVER" -m "$MODEL" -t 1 -tb 1 -np 32 -c $((32 * 1024)) --host 127.0.0.1 --port 18101 --metrics \
  >>/tmp/dpnode-bench/llama-server.log 2>&1 & PIDS+=($!)
wait_http http://127.0.0.1:18101/v1/models
"$DPNODE" join --engine openai --model "$MODEL" --tokenizer "$MODEL" --engine-url http://127.0.0.1:18101 \
  --host 127.0.0.1 --port 18000 --bind 127.0.0.1:17946 --data-parallel-rpc-port 0 --log-level warn \
  2>>/tmp/dpnode-bench/dpnode.log & PIDS+=($!)
wait_http http://127.0.0.1:18000/v1/models
run() { # target url seed clients requests
  local metrics=(); [ "$1" = server ] && metrics=(--metrics-url none)
  "$DPBENCH" --url "$2" "${metrics[@]}" --concurrency "$4" --requests "$5" --input-len fixed:256 --output-len fixed:64 \
    --temperature 0 --seed "$3" --label "$1" --quiet --no-keepalive --out "$OUT/openai-proxy-$1-c$4-r$round.json"
}
for round in $(seq "$ROUNDS"); do
  order="server dpnode"; [ $((round % 2)) = 0 ] && order="dpnode server"
  for target in $order; do
    url=http://127.0.0.1:18101; [ "$target" = dpnode ] && url=http://127.0.0.1:18000
    seed=$((round * 10 + 1)); [ "$target" = dpnode ] && seed=$((round * 10 + 2))
    run "$target" "$url" "$seed" 1 "$ONE_REQUESTS"
    run "$target" "$url" "$((seed + 1000))" 32 96
  done
done
python3 - "$OUT" "$ROUNDS" <<'PY' | tee "$OUT/openai-proxy-table.md"
import json, sys, statistics
out, rounds = sys.argv[1], int(sys.argv[2])
def runs(t, c):
    return [json.load(open(f"{out}/openai-proxy-{t}-c{c}-r{r}.json"))["runs"][0] for r in range(1, rounds + 1)]
def fmt(xs):
    return f"{statistics.median(xs):.1f} ({min(xs):.1f}-{max(xs):.1f})"
print("| clients | target | output tok/s | TTFT p50 ms | TTFT p99 ms | failed |")
print("|---|---|---|---|---|---|")
for c in (1, 32):
    for t in ("server", "dpnode"):
        rs = runs(t, c)
        print(f"| {c} | {t} | {fmt([r['output_token_throughput'] for r in rs])} | {fmt([r['ttft_ms']['p50'] for r in rs])} | "
              f"{fmt([r['ttft_ms']['p99'] for r in rs])} | {sum(r['failed'] for r in rs)} |")
print()
for c in (1, 32):
    s, d = runs("server", c), runs("dpnode", c)
    tp = statistics.median(r["output_token_throughput"] for r in d) / statistics.median(r["output_token_throughput"] for r in s)
    ttft = statistics.median(r["ttft_ms"]["p50"] for r in d) - statistics.median(r["ttft_ms"]["p50"] for r in s)
    print(f"{c} clients: dpnode in front / the server alone: throughput {tp:.3f}x ({(1 - tp) * 100:+.1f}% lost), TTFT p50 {ttft:+.1f} ms")
PY
