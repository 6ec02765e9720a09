# Shared by the benchmark scripts: builds the binaries and cleans up the
# processes a script starts.
set -euo pipefail
export GOTOOLCHAIN="${GOTOOLCHAIN:-go1.27.3}"
cd "$(dirname "$0")/../.."
export PATH="/usr/local/go/bin:$PATH"
OUT=${OUT:-docs/bench/results}
mkdir -p "$OUT" /tmp/dpnode-bench
# BUILT=1: the binaries are already there (a script that runs others builds once).
if [ "${BUILT:-0}" != 1 ]; then
  go build -o /tmp/dpnode-bench/dpnode ./cmd/dpnode
  go build -o /tmp/dpnode-bench/dpbench ./cmd/dpbench
fi
DPNODE=/tmp/dpnode-bench/dpnode
DPBENCH=/tmp/dpnode-bench/dpbench
PIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
}
trap cleanup EXIT
# wait_http URL: until it answers.
wait_http() {
  for _ in $(seq 100); do
    curl -fsS -o /dev/null "$1" 2>/dev/null && return 0
    sleep 0.2
  done
  echo "no answer from $1" >&2
  return 1
}
# stop_all: stops what was started so far.
stop_all() {
  cleanup
  PIDS=()
}
# start_nginx PORT UPSTREAM...: nginx on 127.0.0.1:PORT in front of the
# upstream host:port addresses, least_conn, streaming through unbuffered.
# NGINX_KEEPALIVE=0: a new connection to an upstream for every request.
start_nginx() {
  local port=$1 servers="" keep=""
  shift
  for u in "$@"; do servers+="server $u; "; done
  [ "${NGINX_KEEPALIVE:-512}" -gt 0 ] && keep="keepalive ${NGINX_KEEPALIVE:-512};"
  cat >/tmp/dpnode-bench/nginx.conf <<NGINX
worker_processes 1;
error_log /tmp/dpnode-bench/nginx-error.log;
pid /tmp/dpnode-bench/nginx.pid;
events { worker_connections 8192; }
http {
  access_log off;
  upstream ranks { least_conn; $servers $keep }
  server {
    listen 127.0.0.1:$port;
    location / {
      proxy_pass http://ranks;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_buffering off;
      proxy_read_timeout 600s;
    }
  }
}
NGINX
  nginx -c /tmp/dpnode-bench/nginx.conf -g 'daemon off;' & PIDS+=($!)
}
