#!/usr/bin/env bash
# The llama.cpp engine against llama-server built from the same llama.cpp
# source, on the same machine, model and threads, side by side, ROUNDS
# times: dpnode with one rank (all the threads) and two ranks (half each),
# llama-server with its default per-slot KV cache and with one shared
# cache (-kvu, the layout dpnode uses to share prefixes). Then the prefix
# cache: TTFT of 2,016-token prompts that share nothing against prompts
# that share their first 2,000 tokens.
#
# Needs make llamacpp, and llama-server: LLAMA_SERVER=path, by default
# ~/.cache/dpnode/llama-server-build/bin/llama-server, built from the
# bundle (.llamacpp/src) with
#   cmake -B ~/.cache/dpnode/llama-server-build -DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF \
#     -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF
#   cmake --build ~/.cache/dpnode/llama-server-build --target llama-server -j2
# (about 15 minutes on 2 cores).
source "$(dirname "$0")/common.sh"
ROUNDS=${ROUNDS:-3}
TARGETS=${TARGETS:-llama-server llama-server-kvu dpnode-1 dpnode-2}
THREADS=${THREADS:-2}
LLAMA_SERVER=${LLAMA_SERVER:-$HOME/.cache/dpnode/llama-server-build/bin/llama-server}
WORKER=bin/dpnode-llama-worker
MODEL=/tmp/dpnode-bench/benchmodel.gguf
[ -x "$WORKER" ] || { echo "run make llamacpp first" >&2; exit 1; }
[ -x "$LLAMA_SERVER" ] || { echo "no llama-server at $LLAMA_SERVER (see the top of this script)" >&2; exit 1; }
export DPNODE_LLAMACPP_WORKER=$PWD/$WORKER
# The test model, made so that it never writes part of a UTF-8 character:
# llama-server answers 500 to a completion that ends inside one.
"$DPNODE" testmodel --vocab .llamacpp/src/models/ggml-vocab-llama-bpe.gguf --whole-characters --out "$MODEL" >/dev/null

# F16 KV cache and flash attention, as both run a model that is not F32.
dpnode_args=(join --engine llamacpp --model "$MODEL" --host 127.0.0.1 --port 18000 --bind 127.0.0.1:17946 --data-parallel-rpc-port 0
  --kv-cache-dtype float16 --kv-cache-memory-bytes 64MiB --max-num-seqs 32 --max-model-len 4096 --log-level warn)
server_args=(-m "$MODEL" -t "$THREADS" -tb "$THREADS" -np 32 -c $((32 * 4096)) --host 127.0.0.1 --port 18000)
common=(--url http://127.0.0.1:18000 --input-len fixed:256 --output-len fixed:128 --temperature 0 --no-keepalive --quiet)

start() {
  case "$1" in
  dpnode-1) "$DPNODE" "${dpnode_args[@]}" --gpus 1 --threads "$THREADS" 2>>/tmp/dpnode-bench/dpnode.log & ;;
  dpnode-2) "$DPNODE" "${dpnode_args[@]}" --gpus 2 --threads $((THREADS / 2)) 2>>/tmp/dpnode-bench/dpnode.log & ;;
  llama-server) "$LLAMA_SERVER" "${server_args[@]}" >>/tmp/dpnode-bench/llama-server.log 2>&1 & ;;
  llama-server-kvu) "$LLAMA_SERVER" "${server_args[@]}" -kvu >>/tmp/dpnode-bench/llama-server.log 2>&1 & ;;
  esac
  PIDS+=($!)
  wait_http http://127.0.0.1:18000/v1/models
}

for round in $(seq "$ROUNDS"); do
  for target in $TARGETS; do
    start "$target"
    metrics=(--metrics-url none)
    case "$target" in dpnode-*) metrics=() ;; esac
    for c in 1 8 32; do
      "$DPBENCH" "${common[@]}" "${metrics[@]}" --concurrency "$c" --requests $((c * 8)) --label "$target" \
        --out "$OUT/llamacpp-$target-c$c-r$round.json"
    done
    stop_all
  done
done

# ROUNDS=0 runs only the profile below.
# The prefix cache, one rank: prompts of 2,016 tokens that share nothing,
# then prompts whose first 2,000 tokens are one shared prefix.
for round in $(seq "$ROUNDS"); do
  start dpnode-1
  prefix=(--url http://127.0.0.1:18000 --output-len fixed:1 --temperature 0 --concurrency 1 --requests 20 --quiet)
  "$DPBENCH" "${prefix[@]}" --input-len fixed:2016 --seed "$round" --label "2,016 tokens, no shared prefix" --out "$OUT/llamacpp-prefix-miss-r$round.json"
  "$DPBENCH" "${prefix[@]}" --input-len fixed:16 --prefix-groups 1 --prefix-len 2000 --seed "$round" --label "the same, 2,000 shared" \
    --out "$OUT/llamacpp-prefix-hit-r$round.json"
  stop_all
done

# Where a step's time goes, one rank: the engine's view of its steps
# against the worker's own account of its compute, from /metrics.
for c in 1 32; do
  start dpnode-1
  "$DPBENCH" "${common[@]}" --concurrency "$c" --requests $((c * 8)) --label "dpnode-1 profile" --out "$OUT/llamacpp-profile-c$c.json"
  curl -s http://127.0.0.1:18000/metrics >"$OUT/llamacpp-profile-c$c.metrics"
  stop_all
done

# The table: median (min-max) over the rounds.
python3 - "$OUT" "$ROUNDS" $TARGETS <<'PY'
import json, sys, statistics
out, rounds, targets = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
def load(name):
    return [json.load(open(f"{out}/{name}-r{r}.json"))["runs"][0] for r in range(1, rounds + 1)]
def fmt(xs, nd=0):
    m = statistics.median(xs)
    return f"{m:.{nd}f} ({min(xs):.{nd}f}-{max(xs):.{nd}f})"
print("| target | clients | output tok/s | TTFT p50 ms | TTFT p99 ms | ITL p50 ms | failed |")
print("|---|---|---|---|---|---|---|")
for target in targets if rounds else []:
    for c in [1, 8, 32]:
        runs = load(f"llamacpp-{target}-c{c}")
        print(f"| {target} | {c} | {fmt([r['output_token_throughput'] for r in runs])} | {fmt([r['ttft_ms']['p50'] for r in runs], 1)} | "
              f"{fmt([r['ttft_ms']['p99'] for r in runs], 1)} | {fmt([r['itl_ms']['p50'] for r in runs], 1)} | {sum(r['failed'] for r in runs)} |")
miss, hit = load("llamacpp-prefix-miss"), load("llamacpp-prefix-hit")
ratios = [h["ttft_ms"]["p50"] / m["ttft_ms"]["p50"] for m, h in zip(miss, hit)]
def metric(path, name):
    return sum(float(l.split()[-1]) for l in open(path) if l.startswith(name + "{") or l.startswith(name + " "))
for c in [1, 32]:
    m = f"{out}/llamacpp-profile-c{c}.metrics"
    steps = metric(m, "dpnode_engine_step_seconds_count")
    wall, compute = metric(m, "dpnode_engine_step_seconds_sum"), metric(m, "dpnode_engine_executor_seconds_total")
    tokens = metric(m, "dpnode_engine_computed_tokens_total")
    itl = json.load(open(f"{out}/llamacpp-profile-c{c}.json"))["runs"][0]["itl_ms"]["p50"]
    print(f"\n{c} client(s): {steps:.0f} steps of {tokens / steps:.1f} tokens; a step takes {1000 * wall / steps:.2f} ms as the engine sees it, "
          f"{1000 * compute / steps:.2f} ms in the worker's decode and sampling ({1000 * (wall - compute) / steps:.3f} ms to and from the worker); ITL p50 {itl:.2f} ms")
if rounds:
    print(f"\nprefix cache, TTFT p50: {fmt([m['ttft_ms']['p50'] for m in miss], 1)} ms without a shared prefix, "
          f"{fmt([h['ttft_ms']['p50'] for h in hit], 1)} ms with 2,000 tokens shared: {fmt(ratios, 3)}x")
PY
