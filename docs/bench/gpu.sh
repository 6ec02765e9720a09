#!/usr/bin/env bash
# dpnode's llama.cpp engine on a GPU against llama-server, both on
# llama.cpp built on the GPU machine from the same source with CUDA for
# its GPU: greedy output compared, throughput and latency at 1, 16 and 64
# clients, a prefix hit against a miss, and a kill -9 of the worker under
# load. The model is random weights in Llama 3.2 1B's shape, F16.
#
#   bash docs/bench/gpu.sh pack    # here, after make llamacpp: $G holds what the GPU machine needs
#   bash docs/bench/gpu.sh build   # there: llama.cpp with CUDA, the worker linked to it, the model
#   bash docs/bench/gpu.sh bench   # there: one table on stdout, $R/gpu.json (table: again)
#
# The GPU machine needs CUDA (nvcc), cmake, ninja and python3; no Go and
# no network: pack builds dpnode's binaries (stripped) and packs llama.cpp's
# source and Llama 3's vocabulary into $G (about 25 MB). DRY=1 runs build
# and bench on a CPU, with llama.cpp built without CUDA and a small model,
# to check the script; LLAMA_BUILD=DIR then takes llama.cpp from an
# existing CPU build (docs/bench/trace-cpu.sh's) instead of building it.
# DPNODE_EXTRA adds flags to dpnode (--greedy-in-graph off: greedy rows
# sampled on the host, as before they ran in llama.cpp's graph).
set -euo pipefail
export GOTOOLCHAIN="${GOTOOLCHAIN:-go1.27.3}"
cd "$(dirname "$0")/../.."
G=${G:-$PWD/.gpu}
W=${W:-$G/work}
R=${R:-${OUT:-$G/results}}
DRY=${DRY:-0}
PORT=${PORT:-18000}
CLIENTS=${CLIENTS:-1 16 64}
# Requests per client in the load runs, and whether to kill a worker.
PER_CLIENT=${PER_CLIENT:-6}
KILL=${KILL:-1}
mkdir -p "$G" "$W" "$R"
log() { echo "== $(date +%T) $*"; }

# The 1B shape: 16 layers 2,048 wide, 32 heads over 8 KV heads, a
# feed-forward of 8,192 (Llama 3.2 1B's, with a 128,256-token vocabulary).
shape=(--embedding 2048 --layers 16 --feed-forward 8192 --heads 32 --kv-heads 8)
if [ "$DRY" = 1 ]; then
  shape=(--embedding 256 --layers 4 --feed-forward 768 --heads 4 --kv-heads 2)
fi

pack() {
  [ -f bin/dpnode-llama-worker ] || { echo "run make llamacpp first" >&2; exit 1; }
  log "binaries"
  mkdir -p "$G/bin"
  go build -trimpath -ldflags '-s -w' -o "$G/bin/dpnode" ./cmd/dpnode
  go build -trimpath -ldflags '-s -w' -o "$G/bin/dpbench" ./cmd/dpbench
  cp bin/dpnode-llama-worker "$G/bin/dpnode-llama-worker"
  strip "$G/bin/dpnode-llama-worker"
  for f in dpnode dpbench dpnode-llama-worker; do xz -T0 -f -6 "$G/bin/$f"; done
  log "llama.cpp's source"
  tar -C .llamacpp/src -cf - CMakeLists.txt CMakePresets.json cmake common ggml include src tools vendor licenses LICENSE app scripts |
    xz -T0 -6 >"$G/llama-src.tar.xz"
  xz -T0 -c .llamacpp/src/models/ggml-vocab-llama-bpe.gguf >"$G/vocab.gguf.xz"
  du -sh "$G"
}

build() {
  log "machine"
  nproc
  if [ "$DRY" != 1 ]; then
    nvidia-smi --query-gpu=name,memory.total,driver_version,compute_cap --format=csv,noheader
    nvcc --version | tail -1
  fi
  if [ -n "${LLAMA_BUILD:-}" ]; then
    ln -sfn "$LLAMA_BUILD" "$W/build"
    cmake --build "$W/build" --target llama-server llama-quantize -j "$(nproc)" >"$R/build.log" 2>&1 || { tail -20 "$R/build.log"; exit 1; }
    install_and_model
    return
  fi
  rm -rf "$W/src" && mkdir -p "$W/src" && xz -dc "$G/llama-src.tar.xz" | tar -C "$W/src" -xf -
  local cuda=(-DGGML_CUDA=OFF) target=ggml-cpu
  if [ "$DRY" != 1 ]; then
    # Only the local GPU's architecture: the build is minutes, not an hour.
    arch=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -1 | tr -d '.')
    cuda=(-DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES="$arch")
    target=ggml-cuda
  fi
  log "configure (${cuda[*]})"
  generator=()
  command -v ninja >/dev/null && generator=(-G Ninja)
  cmake -S "$W/src" -B "$W/build" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release "${cuda[@]}" -DGGML_BACKEND_DL=ON -DGGML_NATIVE=OFF \
    -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF >"$R/cmake.log" 2>&1 ||
    { tail -30 "$R/cmake.log"; exit 1; }
  log "build"
  time cmake --build "$W/build" --target "$target" ggml-cpu llama-server llama-quantize -j "$(nproc)" >"$R/build.log" 2>&1 ||
    { grep -E "error|FAILED" "$R/build.log" | head -20; exit 1; }
  install_and_model
}

install_and_model() {
  log "install"
  rm -rf "$W/bin" && mkdir -p "$W/bin/llamacpp"
  for f in dpnode dpbench dpnode-llama-worker; do xz -dc "$G/bin/$f.xz" >"$W/bin/$f" && chmod +x "$W/bin/$f"; done
  cp -P "$W/build/bin/"*.so* "$W/bin/llamacpp/"
  # The worker was linked against the npm package's names for these.
  ln -sf libllama.so "$W/bin/llamacpp/libllama.v0.4.0.so"
  ln -sf libggml.so "$W/bin/llamacpp/libggml.v0.4.0.so"
  if ldd "$W/bin/dpnode-llama-worker" | grep "not found"; then exit 1; fi
  xz -dc "$G/vocab.gguf.xz" >"$W/vocab.gguf"
  log "model"
  export DPNODE_LLAMACPP_WORKER=$W/bin/dpnode-llama-worker
  time "$W/bin/dpnode" testmodel --vocab "$W/vocab.gguf" --whole-characters "${shape[@]}" --context-length 8192 --out "$W/m-f32.gguf"
  "$W/build/bin/llama-quantize" "$W/m-f32.gguf" "$W/m-f16.gguf" F16 >"$R/quantize.log" 2>&1 || { tail -20 "$R/quantize.log"; exit 1; }
  rm -f "$W/m-f32.gguf"
  ls -la "$W/m-f16.gguf"
  log built
}

PIDS=()
stop_all() {
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null || true; done
  PIDS=()
}
trap stop_all EXIT
wait_up() { # pid: until the server lists its model, or the process is gone
  for _ in $(seq 1500); do
    curl -fsS -o /dev/null "http://127.0.0.1:$PORT/v1/models" 2>/dev/null && return 0
    kill -0 "$1" 2>/dev/null || return 1
    sleep 0.2
  done
  return 1
}
gpu_memory() { [ "$DRY" = 1 ] || nvidia-smi --query-gpu=memory.used --format=csv,noheader | head -1; }

start() { # target
  local model=$W/m-f16.gguf t0=$SECONDS
  case "$1" in
  dpnode)
    local dev=()
    [ "$DRY" = 1 ] && dev=(--gpus 1 --threads "$(nproc)" --kv-cache-memory-bytes 512MiB)
    [ "$DRY" = 1 ] || dev=(--kv-cache-memory-bytes 8GiB)
    DPNODE_LLAMACPP_WORKER=$W/bin/dpnode-llama-worker "$W/bin/dpnode" join --engine llamacpp --model "$model" \
      --host 127.0.0.1 --port "$PORT" --bind 127.0.0.1:17946 --data-parallel-rpc-port 0 --max-num-seqs 64 --max-model-len 2048 \
      "${dev[@]}" --log-level info ${DPNODE_EXTRA:-} >"$R/dpnode.log" 2>&1 &
    ;;
  llama-server)
    local dev=(-ngl 99)
    [ "$DRY" = 1 ] && dev=(-ngl 0 -t "$(nproc)")
    LD_LIBRARY_PATH=$W/bin/llamacpp "$W/build/bin/llama-server" -m "$model" "${dev[@]}" -np 64 -c $((64 * 2048)) \
      --host 127.0.0.1 --port "$PORT" >"$R/llama-server.log" 2>&1 &
    ;;
  esac
  PIDS+=($!)
  wait_up $! || { echo "$1 did not start"; tail -20 "$R/$1.log"; return 1; }
  echo "$1 ready in $((SECONDS - t0)) s; GPU memory used: $(gpu_memory)"
}

greedy() { # target: five prompts, greedy, one at a time
  python3 - "$PORT" >"$R/greedy-$1.json" <<'PY'
import json, sys, urllib.request
base = f"http://127.0.0.1:{sys.argv[1]}"
model = json.load(urllib.request.urlopen(base + "/v1/models"))["data"][0]["id"]
prompts = [[128000, 9906, 1917], [128000, 791, 3938, 315, 9822, 374], [128000, 12805, 5304, 264, 892],
           [128000, 40, 1093, 311, 1520, 264, 9160, 315, 279, 1917, 1606], [128000, 2028]]
texts = []
for p in prompts:
    body = json.dumps({"model": model, "prompt": p, "max_tokens": 48, "temperature": 0}).encode()
    req = urllib.request.Request(base + "/v1/completions", body, {"Content-Type": "application/json"})
    texts.append(json.load(urllib.request.urlopen(req))["choices"][0]["text"])
print(json.dumps(texts))
PY
}

load() { # target: closed loops of each number of clients
  local metrics=()
  [ "$1" = llama-server ] && metrics=(--metrics-url none)
  for c in $CLIENTS; do
    "$W/bin/dpbench" --url "http://127.0.0.1:$PORT" "${metrics[@]}" --input-len fixed:512 --output-len fixed:128 --temperature 0 \
      --concurrency "$c" --requests $((c < 4 ? 16 : c * PER_CLIENT)) --no-keepalive --quiet --label "$1" --out "$R/load-$1-c$c.json" | tail -3
  done
}

prefix() { # target: a 1,816-token prompt that shares nothing, then 1,800 shared tokens and 16 own
  local metrics=()
  [ "$1" = llama-server ] && metrics=(--metrics-url none)
  local p=(--url "http://127.0.0.1:$PORT" "${metrics[@]}" --output-len fixed:1 --temperature 0 --concurrency 1 --requests 20 --quiet --no-keepalive)
  "$W/bin/dpbench" "${p[@]}" --input-len fixed:1816 --label "$1 miss" --out "$R/prefix-$1-miss.json" | tail -1
  "$W/bin/dpbench" "${p[@]}" --input-len fixed:16 --prefix-groups 1 --prefix-len 1800 --label "$1 hit" --out "$R/prefix-$1-hit.json" | tail -1
}

kill_worker() { # 32 streams; the rank's worker is killed 4 s in
  "$W/bin/dpbench" --url "http://127.0.0.1:$PORT" --input-len fixed:512 --output-len fixed:256 --temperature 0 --concurrency 32 \
    --requests 128 --no-keepalive --quiet --label kill --out "$R/kill.json" >"$R/kill.txt" 2>&1 &
  local bench=$!
  sleep 4
  for p in $(pgrep -f dpnode-llama-worker); do
    if tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null | grep -q '^DPNODE_WORKER=rank-0$'; then kill -9 "$p" && echo "killed worker $p"; fi
  done
  wait "$bench" || true
  curl -s "http://127.0.0.1:$PORT/metrics" | grep -E '^dpnode_(engine_restarts|requests_migrated|requests_redispatched)_total' || true
}

bench() {
  [ -f "$W/m-f16.gguf" ] || { echo "run $0 build first" >&2; exit 1; }
  log "dpnode, one rank"
  start dpnode
  grep -iE "offload|CUDA0|device" "$R/dpnode.log" | head -5 || true
  greedy dpnode
  load dpnode
  curl -s "http://127.0.0.1:$PORT/metrics" >"$R/dpnode.metrics"
  prefix dpnode
  if [ "$KILL" = 1 ]; then
    log "dpnode: kill -9 of the worker under load"
    kill_worker
  fi
  stop_all
  log "llama-server, the same build and model"
  start llama-server
  greedy llama-server
  load llama-server
  prefix llama-server
  stop_all
  table
  log done
}

table() {
  python3 - "$R" $CLIENTS <<'PY' | tee "$R/gpu-table.md"
import json, re, sys
R, clients = sys.argv[1], [int(c) for c in sys.argv[2:]]
run = lambda name: json.load(open(f"{R}/{name}.json"))["runs"][0]
out = {"load": {}, "prefix": {}}
print("| target | clients | output tok/s | TTFT p50 ms | TTFT p99 ms | ITL p50 ms | failed |")
print("|---|---|---|---|---|---|---|")
for t in ["dpnode", "llama-server"]:
    for c in clients:
        r = run(f"load-{t}-c{c}")
        out["load"][f"{t}-c{c}"] = r
        print(f"| {t} | {c} | {r['output_token_throughput']:.0f} | {r['ttft_ms']['p50']:.1f} | {r['ttft_ms']['p99']:.1f} | {r['itl_ms']['p50']:.2f} | {r['failed']} |")
print()
for t in ["dpnode", "llama-server"]:
    miss, hit = run(f"prefix-{t}-miss"), run(f"prefix-{t}-hit")
    out["prefix"][t] = {"miss_ttft_p50_ms": miss["ttft_ms"]["p50"], "hit_ttft_p50_ms": hit["ttft_ms"]["p50"]}
    print(f"{t}: TTFT p50 of 1,816 tokens {miss['ttft_ms']['p50']:.1f} ms without a shared prefix, {hit['ttft_ms']['p50']:.1f} ms with 1,800 shared")
a, b = json.load(open(f"{R}/greedy-dpnode.json")), json.load(open(f"{R}/greedy-llama-server.json"))
out["greedy_equal"] = [x == y for x, y in zip(a, b)]
print(f"greedy output equal to llama-server's: {sum(out['greedy_equal'])} of {len(a)}")
try:
    k = run("kill")
    out["kill"] = {"completed": k["completed"], "failed": k["failed"]}
    print(f"kill -9 of the worker during 32 streams: {k['completed']} completed, {k['failed']} failed")
except FileNotFoundError:
    pass
# Where a step's time went in dpnode's load runs, per step.
m = open(f"{R}/dpnode.metrics").read()
def total(name, phase=None):
    pat = name + (r'\{[^}]*phase="' + phase + r'"[^}]*\}' if phase else r'(?:\{[^}]*\})?')
    return sum(float(v) for v in re.findall(r'^' + pat + r' ([0-9.e+-]+)$', m, re.M))
steps = total("dpnode_engine_steps_total")
if steps:
    phases = {p: 1000 * total("dpnode_engine_step_phase_seconds_total", p) / steps
              for p in ["engine", "transport", "kv_ops", "model", "sample", "executor_other"]}
    out["step_ms"] = phases
    print(f"dpnode, per step over {steps:.0f} steps (ms): " + ", ".join(f"{p} {v:.3f}" for p, v in phases.items()))
json.dump(out, open(f"{R}/gpu.json", "w"), indent=1)
PY
}

case "${1:-}" in
pack) pack ;;
build) build ;;
bench) bench ;;
table) table ;;
*) echo "usage: $0 pack|build|bench|table" >&2; exit 2 ;;
esac
