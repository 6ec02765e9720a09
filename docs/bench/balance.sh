#!/usr/bin/env bash
# Balancing quality on real processes: one dpnode of four ranks (simulated
# 8B on H100 steps, in real time) per policy, and four external-mode
# ranks behind nginx least_conn; heavy-tailed lengths at 50, 80 and 95%
# of the capacity the simulator measures for the same four ranks.
source "$(dirname "$0")/common.sh"
REQUESTS=${REQUESTS:-3000}
LOADS=${LOADS:-0.5,0.8,0.95}
# SEED draws another workload of the same shape; TAG names a repeat's
# results (balance-TAG-POLICY.json) and leaves the plot of the first alone.
SEED=${SEED:-7}
TAG=${TAG:+$TAG-}
work=(--input-len lognormal:1000,1 --input-max 16384 --output-len lognormal:200,1 --output-max 2048 --requests "$REQUESTS" --seed "$SEED")
CAPACITY=${CAPACITY:-$("$DPBENCH" --simulate --ranks 4 "${work[@]}" --load 1 --requests 1 --quiet | awk '/^capacity:/ {print $2}')}
echo "capacity of four ranks (simulated): $CAPACITY requests/s"
for policy in ${POLICIES:-live vllm round-robin p2c}; do
  "$DPNODE" join --host 127.0.0.1 --port 18000 --bind 127.0.0.1:17946 --data-parallel-rpc-port 0 \
    --gpus 4 --balance-policy "$policy" --log-level warn 2>>/tmp/dpnode-bench/dpnode.log & PIDS+=($!)
  wait_http http://127.0.0.1:18000/health
  "$DPBENCH" --url http://127.0.0.1:18000 --label "dpnode $policy" --capacity "$CAPACITY" --load "$LOADS" "${work[@]}" --quiet \
    --out "$OUT/balance-$TAG$policy.json"
  stop_all
done
# nginx least_conn in front of four external-mode ranks.
if [ "${NGINX:-1}" = 1 ]; then
seeds=127.0.0.61:7946
for i in 0 1 2 3; do
  ip=127.0.0.6$((i + 1))
  args=(join --host 127.0.0.1 --port $((18100 + i)) --bind "$ip:7946" --data-parallel-rpc-port 29550
    --data-parallel-size 4 --data-parallel-rank "$i" --gpus 1 --gossip-profile local --log-level warn)
  [ "$i" -gt 0 ] && args+=(--seeds "$seeds")
  "$DPNODE" "${args[@]}" 2>>/tmp/dpnode-bench/dpnode.log & PIDS+=($!)
  wait_http http://127.0.0.1:$((18100 + i))/health
done
start_nginx 18080 127.0.0.1:1810{0,1,2,3}
wait_http http://127.0.0.1:18080/v1/models
metrics=http://127.0.0.1:18100/metrics,http://127.0.0.1:18101/metrics,http://127.0.0.1:18102/metrics,http://127.0.0.1:18103/metrics
"$DPBENCH" --url http://127.0.0.1:18080 --metrics-url "$metrics" --label "nginx least_conn" --capacity "$CAPACITY" --load "$LOADS" "${work[@]}" --quiet \
  --out "$OUT/balance-${TAG}nginx.json"
stop_all
fi
if [ -z "$TAG" ]; then
  "$DPBENCH" plot "$OUT"/balance-{live,vllm,round-robin,p2c,nginx}.json --out docs/bench/balance.svg --title "four ranks, real processes: lognormal prompts (median 1000) and outputs (median 200)"
fi
