#!/usr/bin/env bash
# Times reads and writes of a 64 MiB HA file (3 replicas over 4 servers) while
# one server is SIGSTOPped (slow, not dead): how long a client waits on a server that
# does not answer (docs/api.md, "Failover and timeouts").
#
#   scripts/stopped-replica.sh [path/to/gd2fs]      (default: builds ./bin/gd2fs)
#   PORT=21200 scripts/stopped-replica.sh           (uses PORT..PORT+4 on 127.0.0.1)
set -u
cd "$(dirname "$0")/.."
BIN=${1:-}
if [ -z "$BIN" ]; then go build -o bin/gd2fs ./cmd/gd2fs && BIN=$PWD/bin/gd2fs; fi
PORT=${PORT:-21200}
D=$(mktemp -d /tmp/gd2fs-stopped.XXXXXX)
M=127.0.0.1:$PORT
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -CONT "$p" 2>/dev/null; kill "$p" 2>/dev/null; done
  wait 2>/dev/null
  rm -rf "$D"
}
trap cleanup EXIT
now() { date +%s.%N; }
since() { echo "$(now) - $1" | bc; }
"$BIN" master --listen "$M" --meta "sqlite://$D/meta.db" >"$D/m.log" 2>&1 & pids+=($!)
for i in 1 2 3 4; do
  "$BIN" server --master "http://$M" --listen "127.0.0.1:$((PORT + i))" --id "s$i" --mem 512MiB --heartbeat 200ms >"$D/s$i.log" 2>&1 & pids+=($!)
done
export GD2FS_MASTER=http://$M
for _ in $(seq 100); do [ "$("$BIN" status 2>/dev/null | grep -c ' up ')" = 4 ] && break; sleep 0.2; done
head -c 67108864 /dev/urandom >"$D/f"
"$BIN" cp --pool ha --chunk-size 4MiB "$D/f" gd2fs://local/f >/dev/null || exit 1
t=$(now); "$BIN" cat gd2fs://local/f | cmp - "$D/f" && echo "read, every server up:         $(since "$t") s"
up() { "$BIN" status 2>/dev/null | grep -c ' up '; }
kill -STOP "${pids[2]}"
# Right after the stop the master still lists s2 as up (--down-after 5s):
# the client's own deadline is all that bounds the wait.
t=$(now); "$BIN" cat gd2fs://local/f | cmp - "$D/f" && echo "read, s2 just stopped:        $(since "$t") s"
kill -CONT "${pids[2]}"
for _ in $(seq 100); do [ "$(up)" = 4 ] && break; sleep 0.2; done
kill -STOP "${pids[2]}"
t=$(now); out=$("$BIN" cp --pool ha --chunk-size 4MiB "$D/f" gd2fs://local/g 2>&1)
echo "write, s2 just stopped:       $(since "$t") s: ${out:-ok}"
for _ in $(seq 100); do [ "$(up)" = 3 ] && break; sleep 0.2; done
t=$(now); "$BIN" cat gd2fs://local/f | cmp - "$D/f" && echo "read, s2 stopped and down:    $(since "$t") s"
t=$(now); out=$("$BIN" cp --pool ha --chunk-size 4MiB "$D/f" gd2fs://local/h 2>&1)
echo "write, s2 stopped and down:   $(since "$t") s: ${out:-ok}"
