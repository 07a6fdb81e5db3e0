#!/usr/bin/env bash
# redis-benchmark (the C client) against gd2fs's Redis-protocol endpoint and
# against a real redis-server, both separate processes on loopback, same
# run, same settings; prints requests/s of each and the ratio.
#
#   bash scripts/bench-resp.sh                 # all sizes, -c 4/16, -P 1/8
#   SIZES="1048576" CLIENTS="16" PIPES="8" bash scripts/bench-resp.sh
#   BASE_PORT=17100 bash scripts/bench-resp.sh # ports BASE..BASE+30 are used
#
# For each value size both stores start fresh: gd2fs up with one data server
# (its RESP endpoint serves every key from its own DRAM tier: the fair match
# for one redis-server) and redis-server without persistence.
#   SET: keys random in 0..999999 (-r 1000000): nearly all distinct.
#   GET: keys random in 0..N/4-1, first filled by an unmeasured SET pass of N
#        requests (98% of them present); the hit ratio of each store is printed.
# Needs redis-server and redis-benchmark (Debian: redis-server, redis-tools).
set -euo pipefail
cd "$(dirname "$0")/.."

SIZES=${SIZES:-"65536 1048576 4194304"}
CLIENTS=${CLIENTS:-"4 16"}
PIPES=${PIPES:-"1 8"}
BASE_PORT=${BASE_PORT:-17100}
KV_MEM=${KV_MEM:-4GiB}

for t in redis-server redis-benchmark redis-cli; do
  command -v $t >/dev/null || { echo "bench-resp: $t not found (apt-get install redis-server redis-tools)" >&2; exit 1; }
done

work=$(mktemp -d /tmp/gd2fs-bench-resp.XXXXXX)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; done
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 1' INT TERM # so the EXIT trap stops the stores
go build -o "$work/gd2fs" ./cmd/gd2fs

gport=$((BASE_PORT + 10)) # gd2fs RESP endpoint
rport=$((BASE_PORT + 20)) # redis-server

wait_port() {
  for _ in $(seq 100); do redis-cli -p "$1" PING >/dev/null 2>&1 && return 0; sleep 0.1; done
  echo "bench-resp: nothing answers on port $1" >&2; exit 1
}

start_stores() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; done
  pids=()
  rm -rf "$work/data"
  "$work/gd2fs" up --servers 1 --listen 127.0.0.1:$BASE_PORT --port $((BASE_PORT + 1)) --resp-port $gport \
    --dir "$work/data" --mem 16MiB --disk 0 --kv-mem "$KV_MEM" --kv-disk 0 >"$work/up.log" 2>&1 &
  pids+=($!)
  redis-server --port $rport --save '' --appendonly no --bind 127.0.0.1 --protected-mode no >"$work/redis.log" 2>&1 &
  pids+=($!)
  wait_port $gport
  wait_port $rport
}

# rps PORT ARGS...: requests per second of one redis-benchmark test.
rps() {
  local port=$1; shift
  redis-benchmark -p "$port" --csv "$@" | awk -F'","' 'NR>1 {gsub(/"/, "", $2); print $2; exit}'
}

hits() { # PORT: keyspace hit ratio since the last CONFIG RESETSTAT
  redis-cli -p "$1" INFO stats | tr -d '\r' | awk -F: '/^keyspace_hits/ {h=$2} /^keyspace_misses/ {m=$2} END {if (h+m) printf "%.0f%%", 100*h/(h+m); else print "-"}'
}

echo "redis-benchmark: gd2fs RESP endpoint (1 data server, gd2fs up) vs redis-server $(redis-server --version | awk '{print $3}'), loopback, $(nproc) cores"
printf "%-4s %-9s %3s %3s %12s %12s %7s %s\n" op size c P "gd2fs req/s" "redis req/s" ratio "GET hits gd2fs/redis"
for d in $SIZES; do
  case $d in 65536) n=8192 ;; 1048576) n=512 ;; 4194304) n=192 ;; *) n=$((512 * 1048576 / d)) ;; esac
  start_stores
  for c in $CLIENTS; do
    for p in $PIPES; do
      g=$(rps $gport -t set -d "$d" -c "$c" -P "$p" -n "$n" -r 1000000)
      r=$(rps $rport -t set -d "$d" -c "$c" -P "$p" -n "$n" -r 1000000)
      printf "%-4s %-9s %3s %3s %12.0f %12.0f %6.2fx\n" SET "$d" "$c" "$p" "$g" "$r" "$(echo "$g / $r" | bc -l)"
    done
  done
  # Fill keys 0..n/4-1 on both, then measure GETs of them.
  for port in $gport $rport; do
    rps $port -t set -d "$d" -c 16 -P 8 -n "$n" -r $((n / 4)) >/dev/null
  done
  for c in $CLIENTS; do
    for p in $PIPES; do
      redis-cli -p $gport CONFIG RESETSTAT >/dev/null; redis-cli -p $rport CONFIG RESETSTAT >/dev/null
      g=$(rps $gport -t get -d "$d" -c "$c" -P "$p" -n "$n" -r $((n / 4)))
      gh=$(hits $gport)
      r=$(rps $rport -t get -d "$d" -c "$c" -P "$p" -n "$n" -r $((n / 4)))
      rh=$(hits $rport)
      printf "%-4s %-9s %3s %3s %12.0f %12.0f %6.2fx %s/%s\n" GET "$d" "$c" "$p" "$g" "$r" "$(echo "$g / $r" | bc -l)" "$gh" "$rh"
    done
  done
done
