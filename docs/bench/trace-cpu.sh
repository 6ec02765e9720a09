#!/usr/bin/env bash
# dpnode's llama.cpp engine against plain llama-servers behind nginx, on a
# real trace with shared prefixes, side by side, ROUNDS times.
#
# Two ranks of one CPU thread each, on the same random-weight model with
# Llama 3's tokenizer (4 layers 256 wide, 128,256-token vocabulary), F16 KV:
#   nginx          two llama-servers (-t 1 -np 16, their own prompt caches)
#                  behind nginx least_conn
#   dpnode-live    dpnode, two ranks, its live balancing with prefix affinity
#   dpnode-rr      the same, round robin
#   dpnode-nopc    dpnode live, --no-enable-prefix-caching
#   dpnode-openai  the nginx target's two llama-servers, unmodified, with
#                  dpnode in front (--engine openai) instead of nginx
#   dpnode-openai-rr  the same, round robin
#   dpnode-openai-stN the same with --max-num-batched-tokens N, which for
#                  this engine only sets the unit its waiting prefill is
#                  weighed in (32 requests a unit): st8192 weighs 2,048
#                  waiting tokens as 8 requests, the default as 32
#   floor-dpnode   the bound no balancing can beat: one rank of dpnode, each
#                  request sent alone (one client in a closed loop, one
#                  output token) in the trace's order, so that each finds
#                  what the trace's earlier requests left in the prefix
#                  cache; only its TTFT means something, and it ignores
#                  the rate
#   floor-llama-server  the same, one llama-server (behind nginx)
#   floor-dpnode-nopc   the same, dpnode without its prefix cache
# dpnode's KV cache (KV, 2GiB a rank) holds 256 streams of 4,096 tokens: 16
# run requests, the rest keep finished ones' prefixes. llama-server keeps
# its prompt cache in up to 8 GiB of host memory (--cache-ram's default).
# The workload is Mooncake's conversation trace (../shared/data): the
# first REQUESTS requests, hash blocks of 16 tokens (prompt lengths divided
# by 32), outputs cut to 48, greedy, as Poisson arrivals at each of RATES
# per second (the trace's own spacing is hours). Every run starts its
# servers afresh: the same prompts again would find the last run's caches.
#
# Both run the same llama.cpp build: LLAMA_BUILD, built from the bundle's
# source (.llamacpp/src) for this CPU, whose llama-server the nginx target
# runs and whose libraries dpnode's worker loads here in place of the npm
# package's prebuilt ones (which computed steps of several sequences 1.5
# times slower on the benchmark machine):
#   cmake -S .llamacpp/src -B ~/.cache/dpnode/llama-server-build -DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF \
#     -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF
#   cmake --build ~/.cache/dpnode/llama-server-build --target llama-server -j2   # about 15 minutes on 2 cores
# Needs make llamacpp (the worker) and nginx. BEFORE=DIR adds
# dpnode-before: a dpnode and worker built from an earlier commit, in
# DIR/dpnode and DIR/dpnode-llama-worker.
source "$(dirname "$0")/common.sh"
ROUNDS=${ROUNDS:-3}
RATES=${RATES:-3,5}
REQUESTS=${REQUESTS:-200}
TARGETS=${TARGETS:-nginx dpnode-live dpnode-rr dpnode-nopc${BEFORE:+ dpnode-before}}
TRACE=${TRACE:-../shared/data/mooncake-fast25/conversation_trace.jsonl}
LLAMA_BUILD=${LLAMA_BUILD:-$HOME/.cache/dpnode/llama-server-build}
LLAMA_SERVER=$LLAMA_BUILD/bin/llama-server
MODEL=/tmp/dpnode-bench/tracemodel.gguf
[ -x bin/dpnode-llama-worker ] || { echo "run make llamacpp first" >&2; exit 1; }
[ -x "$LLAMA_SERVER" ] || { echo "no llama-server in $LLAMA_BUILD (see the top of this script)" >&2; exit 1; }
[ -f "$TRACE" ] || { echo "no trace at $TRACE" >&2; exit 1; }
command -v nginx >/dev/null || { echo "needs nginx (apt-get install nginx)" >&2; exit 1; }
# with_build_libs DIR WORKER: the worker in DIR, with LLAMA_BUILD's
# libraries under the names it was linked against.
with_build_libs() {
  rm -rf "$1" && mkdir -p "$1/llamacpp"
  cp "$2" "$1/dpnode-llama-worker"
  cp -P "$LLAMA_BUILD"/bin/lib{llama,ggml,ggml-base,ggml-cpu}.so* "$1/llamacpp/"
  ln -sf libllama.so "$1/llamacpp/libllama.v0.4.0.so"
  ln -sf libggml.so "$1/llamacpp/libggml.v0.4.0.so"
}
with_build_libs /tmp/dpnode-bench/worker bin/dpnode-llama-worker
export DPNODE_LLAMACPP_WORKER=/tmp/dpnode-bench/worker/dpnode-llama-worker
[ -n "${BEFORE:-}" ] && with_build_libs /tmp/dpnode-bench/worker-before "$BEFORE/dpnode-llama-worker"
# --whole-characters: llama-server answers 500 to a completion that ends
# inside a UTF-8 character.
"$DPNODE" testmodel --vocab .llamacpp/src/models/ggml-vocab-llama-bpe.gguf --whole-characters \
  --embedding 256 --layers 4 --feed-forward 768 --heads 4 --kv-heads 2 --out "$MODEL" >/dev/null

work=(--trace "$TRACE" --trace-block-tokens 16 --output-max 48 --max-model-len 4096 --requests "$REQUESTS"
  --temperature 0 --quiet)
dpnode_args=(join --engine llamacpp --model "$MODEL" --host 127.0.0.1 --port 18000 --bind 127.0.0.1:17946
  --data-parallel-rpc-port 0 --gpus 2 --threads 1 --kv-cache-dtype float16 --kv-cache-memory-bytes ${KV:-2GiB}
  --max-num-seqs 16 --max-model-len 4096 --log-level warn ${DPNODE_EXTRA:-})

# llama_servers: the two llama-servers the nginx and dpnode-openai targets
# stand in front of, on 18101 and 18102.
llama_servers() {
  for i in 0 1; do
    "$LLAMA_SERVER" -m "$MODEL" -t 1 -tb 1 -np 16 -c $((16 * 4096)) --host 127.0.0.1 --port $((18101 + i)) --metrics \
      >>/tmp/dpnode-bench/llama-server.log 2>&1 & PIDS+=($!)
  done
  wait_http http://127.0.0.1:18101/v1/models && wait_http http://127.0.0.1:18102/v1/models
}

start() {
  case "$1" in
  nginx)
    llama_servers
    start_nginx 18000 127.0.0.1:18101 127.0.0.1:18102
    ;;
  dpnode-openai|dpnode-openai-rr|dpnode-openai-st*)
    # The same two llama-servers, unmodified, with dpnode in front (-rr:
    # round robin).
    llama_servers
    local policy=live
    [ "$1" = dpnode-openai-rr ] && policy=round-robin
    local step=()
    [[ "$1" == dpnode-openai-st* ]] && step=(--max-num-batched-tokens "${1#dpnode-openai-st}")
    "$DPNODE" join --engine openai --balance-policy "$policy" "${step[@]}" --model "$MODEL" --tokenizer "$MODEL" --engine-url http://127.0.0.1:18101 \
      --engine-url http://127.0.0.1:18102 --host 127.0.0.1 --port 18000 --bind 127.0.0.1:17946 --data-parallel-rpc-port 0 \
      --log-level warn ${DPNODE_EXTRA:-} 2>>/tmp/dpnode-bench/dpnode.log & PIDS+=($!)
    ;;
  floor-llama-server)
    # llama-server closes a connection after each stream, and a request
    # that follows at once on it fails (one client in a closed loop does
    # that): behind nginx, with a new connection for each request.
    "$LLAMA_SERVER" -m "$MODEL" -t 1 -tb 1 -np 16 -c $((16 * 4096)) --host 127.0.0.1 --port 18101 \
      >>/tmp/dpnode-bench/llama-server.log 2>&1 & PIDS+=($!)
    wait_http http://127.0.0.1:18101/v1/models
    NGINX_KEEPALIVE=0 start_nginx 18000 127.0.0.1:18101
    ;;
  floor-dpnode) "$DPNODE" "${dpnode_args[@]}" --gpus 1 2>>/tmp/dpnode-bench/dpnode.log & PIDS+=($!) ;;
  floor-dpnode-nopc) "$DPNODE" "${dpnode_args[@]}" --gpus 1 --no-enable-prefix-caching 2>>/tmp/dpnode-bench/dpnode.log & PIDS+=($!) ;;
  dpnode-live) "$DPNODE" "${dpnode_args[@]}" --balance-policy live 2>>/tmp/dpnode-bench/dpnode.log & PIDS+=($!) ;;
  dpnode-rr) "$DPNODE" "${dpnode_args[@]}" --balance-policy round-robin 2>>/tmp/dpnode-bench/dpnode.log & PIDS+=($!) ;;
  dpnode-nopc) "$DPNODE" "${dpnode_args[@]}" --balance-policy live --no-enable-prefix-caching 2>>/tmp/dpnode-bench/dpnode.log & PIDS+=($!) ;;
  dpnode-before)
    DPNODE_LLAMACPP_WORKER=/tmp/dpnode-bench/worker-before/dpnode-llama-worker "$BEFORE/dpnode" "${dpnode_args[@]}" --balance-policy live \
      2>>/tmp/dpnode-bench/dpnode.log & PIDS+=($!) ;;
  esac
  # A model worker takes seconds to load: wait up to a minute.
  for _ in $(seq 300); do curl -fsS -o /dev/null http://127.0.0.1:18000/v1/models 2>/dev/null && return 0; sleep 0.2; done
  echo "$1 did not start" >&2
  return 1
}

for round in $(seq "$ROUNDS"); do
  # The targets' order turns around every other round: whichever runs
  # first in a round does not always get the machine in the same state.
  order=$TARGETS
  [ $((round % 2)) = 0 ] && order=$(printf '%s\n' $TARGETS | tac | tr '\n' ' ')
  for rate in ${RATES//,/ }; do
    for target in $order; do
      metrics=()
      [ "$target" = nginx ] || [ "$target" = floor-llama-server ] && metrics=(--metrics-url none)
      load=(--rate "$rate")
      [[ "$target" == floor-* ]] && load=(--concurrency 1 --output-max 1)
      start "$target"
      "$DPBENCH" --url http://127.0.0.1:18000 "${metrics[@]}" "${work[@]}" "${load[@]}" --label "$target" ${DETAIL:+--detail} \
        --out "$OUT/trace-cpu-$target-$rate-r$round.json"
      stop_all
    done
  done
done

# The table: median (min-max) over the rounds, by rate; then the goals.
python3 - "$OUT" "$ROUNDS" "$RATES" $TARGETS <<'PY' | tee "$OUT/trace-cpu-table.md"
import json, sys, statistics
out, rounds, rates, targets = sys.argv[1], int(sys.argv[2]), sys.argv[3].split(","), sys.argv[4:]
# runs[t][r][i]: target t, round r, rate i.
runs = {t: [[json.load(open(f"{out}/trace-cpu-{t}-{rate}-r{r}.json"))["runs"][0] for rate in rates] for r in range(1, rounds + 1)]
        for t in targets}
rates = [float(r) for r in rates]
def med(t, i, key, pct=None):
    xs = [rs[i][key][pct] if pct else rs[i][key] for rs in runs[t]]
    return statistics.median(xs), min(xs), max(xs)
def fmt(v):
    m, lo, hi = v
    u = lambda x: f"{x:.0f}" if x >= 10 else f"{x:.1f}"
    return f"{u(m)} ({u(lo)}-{u(hi)})"
print("| rate/s | target | TTFT p50 ms | TTFT p90 ms | TTFT p99 ms | ITL p50 ms | ITL p99 ms | E2E p99 ms | output tok/s | failed |")
print("|---|---|---|---|---|---|---|---|---|---|")
for i, rate in enumerate(rates):
    for t in targets:
        cells = [fmt(med(t, i, k, p)) for k, p in [("ttft_ms", "p50"), ("ttft_ms", "p90"), ("ttft_ms", "p99"), ("itl_ms", "p50"), ("itl_ms", "p99"),
                                                   ("e2e_ms", "p99"), ("output_token_throughput", None)]]
        failed = sum(rs[i]["failed"] for rs in runs[t])
        print(f"| {rate:g} | {t} | " + " | ".join(cells) + f" | {failed} |")
if "nginx" in targets and "dpnode-openai" in targets:
    print()
    for i, rate in enumerate(rates):
        ratio = lambda k, p: med("dpnode-openai", i, k, p)[0] / med("nginx", i, k, p)[0]
        print(f"rate {rate:g}/s: dpnode in front of the llama-servers / nginx in front of them: TTFT p50 {ratio('ttft_ms', 'p50'):.2f}x, "
              f"p90 {ratio('ttft_ms', 'p90'):.2f}x, p99 {ratio('ttft_ms', 'p99'):.2f}x, E2E p99 {ratio('e2e_ms', 'p99'):.2f}x")
for f in [t for t in targets if t.startswith("floor-")]:
    if "nginx" in targets:
        print()
        for i, rate in enumerate(rates):
            print(f"rate {rate:g}/s: {f}'s TTFT p90 (each request alone) / nginx's at this rate: "
                  f"{med(f, i, 'ttft_ms', 'p90')[0] / med('nginx', i, 'ttft_ms', 'p90')[0]:.2f}x")
if "nginx" in targets and "dpnode-live" in targets:
    print()
    for i, rate in enumerate(rates):
        ratio = lambda a, b, k, p: med(a, i, k, p)[0] / med(b, i, k, p)[0]
        line = (f"rate {rate:g}/s: dpnode live / nginx: TTFT p90 {ratio('dpnode-live', 'nginx', 'ttft_ms', 'p90'):.2f}x, "
                f"E2E p99 {ratio('dpnode-live', 'nginx', 'e2e_ms', 'p99'):.2f}x")
        if "dpnode-nopc" in targets:
            line += f"; prefix cache off / on: TTFT p90 {ratio('dpnode-nopc', 'dpnode-live', 'ttft_ms', 'p90'):.2f}x"
        print(line)
PY
# DETAIL=1 with dpnode-live and dpnode-nopc: what the prefix cache did,
# request by request (first round): TTFT with and without it, by how much
# of the prompt it found, and for the slowest tenth without it, how much an
# earlier request of the trace had computed (the most any cache can find).
if [ -n "${DETAIL:-}" ] && [[ " $TARGETS " == *" dpnode-live "* && " $TARGETS " == *" dpnode-nopc "* ]]; then
  python3 - "$OUT" "$RATES" "$TRACE" "$REQUESTS" <<'PY' | tee "$OUT/trace-cpu-prefix.md"
import json, sys, statistics
out, rates, trace, n = sys.argv[1], sys.argv[2].split(","), sys.argv[3], int(sys.argv[4])
# shared[i]: hash blocks of request i's prompt that an earlier request had.
seen, shared = set(), []
with open(trace) as f:
    for line, _ in zip(f, range(n)):
        h = json.loads(line)["hash_ids"]
        k = 0
        while k < len(h) and tuple(h[:k + 1]) in seen:
            k += 1
        shared.append(k)
        seen.update(tuple(h[:j]) for j in range(1, len(h) + 1))
print("| rate/s | requests | how many | cached tokens (median) | TTFT median, cache on / off ms | TTFT mean, on / off ms |")
print("|---|---|---|---|---|---|")
for rate in rates:
    on, off = ([r for r in json.load(open(f"{out}/trace-cpu-{t}-{rate}-r1.json"))["runs"][0]["requests"]]
               for t in ("dpnode-live", "dpnode-nopc"))
    groups = [("found 256 tokens or more", lambda r: r["cached_tokens"] >= 256),
              ("found 17 to 255", lambda r: 16 < r["cached_tokens"] < 256),
              ("found 16 or less", lambda r: r["cached_tokens"] <= 16)]
    for name, keep in groups:
        idx = [i for i, r in enumerate(on) if keep(r)]
        if not idx:
            continue
        m = lambda rs, f: f([rs[i]["ttft_ms"] for i in idx])
        print(f"| {rate} | {name} | {len(idx)} | {statistics.median(on[i]['cached_tokens'] for i in idx):.0f} | "
              f"{m(on, statistics.median):.0f} / {m(off, statistics.median):.0f} | {m(on, statistics.mean):.0f} / {m(off, statistics.mean):.0f} |")
    # Requests that found nothing past the system prompt and arrived with
    # no request in flight in either run: neither queueing nor routing
    # touched them, so what differs is the engine's own cost.
    def idle(rs, i):
        t = rs[i]["start_ms"]
        return not any(r["start_ms"] + r["e2e_ms"] > t for r in rs[:i])
    alone = [i for i, r in enumerate(on) if r["cached_tokens"] <= 16 and idle(on, i) and idle(off, i)]
    if alone:
        print(f"\nrate {rate}/s: {len(alone)} requests found 16 tokens or less and arrived with nothing in flight in either run: "
              f"TTFT median {statistics.median(on[i]['ttft_ms'] for i in alone):.0f} ms with the cache, "
              f"{statistics.median(off[i]['ttft_ms'] for i in alone):.0f} without, "
              f"{statistics.median(on[i]['ttft_ms'] / off[i]['ttft_ms'] for i in alone):.2f}x request by request")
    slow = sorted(range(len(off)), key=lambda i: -off[i]["ttft_ms"])[:len(off) // 10]
    print(f"\nrate {rate}/s: of the {len(slow)} slowest first tokens without the cache, {sum(shared[i] > 1 for i in slow)} "
          f"share more than the first block with an earlier request (median prompt {statistics.median(off[i]['prompt_tokens'] for i in slow):.0f} tokens)\n")
PY
fi
files=()
for target in $TARGETS; do
  [[ "$target" == floor-* ]] && continue
  for rate in ${RATES//,/ }; do files+=("$OUT/trace-cpu-$target-$rate-r1.json"); done
done
# The plot is the documentation's only for the documentation's results.
plot=$OUT/trace-cpu.svg
[ "$OUT" = docs/bench/results ] && plot=docs/bench/trace-cpu.svg
"$DPBENCH" plot "${files[@]}" --out "$plot" \
  --title "Mooncake trace, two CPU ranks: dpnode and llama-servers behind nginx"
