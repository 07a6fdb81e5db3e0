#!/usr/bin/env bash
# Checks the operations files under deploy/ with the tools that run them:
#   - systemd units: systemd-analyze verify (any complaint fails)
#   - Prometheus rules: promtool check rules, promtool test rules
#   - end to end: a real Prometheus (loopback, 1s scrapes) scrapes a running
#     `gd2fs up` plus one more data server; with the rules' `for:` set to 0s,
#     no alert fires while the cluster is healthy; the extra server holding
#     HA replicas is SIGKILLed and GD2FSServerDown (naming it) and
#     GD2FSHAUnderReplicated must fire; the metrics the rules read must be in
#     Prometheus. Bounded: every wait has a deadline (about 40 s in all).
# A tool that is not installed is reported as a SKIP (.ci/run installs them).
#
#   bash scripts/ops-test.sh
set -euo pipefail
cd "$(dirname "$0")/.."
fail() { echo "ops-test: FAIL: $*" >&2; exit 1; }
work=$(mktemp -d /tmp/gd2fs-ops-test.XXXXXX)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  rm -rf "$work"
}
trap cleanup EXIT
go build -o "$work/gd2fs" ./cmd/gd2fs

if command -v systemd-analyze >/dev/null 2>&1; then
  mkdir "$work/units"
  for u in deploy/systemd/*.service; do
    sed "s|/usr/local/bin/gd2fs|$work/gd2fs|" "$u" > "$work/units/$(basename "$u")"
  done
  cp "$work/units/gd2fs-server@.service" "$work/units/gd2fs-server@nvme0.service"
  out=$(cd "$work/units" && systemd-analyze verify --man=no ./gd2fs-master.service ./gd2fs-server@nvme0.service 2>&1) \
    || fail "systemd-analyze verify: $out"
  [ -z "$out" ] || fail "systemd-analyze verify complains: $out"
  echo "== systemd units: systemd-analyze verify clean"
else
  echo "== SKIP systemd units: systemd-analyze not installed (apt-get install systemd)"
fi

if ! command -v promtool >/dev/null 2>&1 || ! command -v prometheus >/dev/null 2>&1; then
  echo "== SKIP Prometheus rules: promtool/prometheus not installed (apt-get install prometheus)"
  exit 0
fi
promtool check rules deploy/prometheus/gd2fs-alerts.yml >/dev/null || fail "promtool check rules"
(cd deploy/prometheus && promtool test rules gd2fs-alerts.test.yml >/dev/null) || fail "promtool test rules (run it in deploy/prometheus to see)"
echo "== Prometheus rules: promtool check rules and test rules pass"

# Free loopback ports: master, extra server, Prometheus, and a base for
# up's 3 servers (base, base+1, base+2).
read -r pm px pp base < <(/usr/bin/python3 - <<'PY'
import random, socket
def free(p):
    s = socket.socket()
    try:
        s.bind(("127.0.0.1", p)); return True
    except OSError:
        return False
    finally:
        s.close()
ss = [socket.socket() for _ in range(3)]
for s in ss: s.bind(("127.0.0.1", 0))
ports = [s.getsockname()[1] for s in ss]
for s in ss: s.close()
while True:
    b = random.randint(20000, 30000)
    if all(free(b + i) for i in range(3)) and not set(range(b, b + 3)) & set(ports):
        break
print(*ports, b)
PY
)
master="http://127.0.0.1:$pm"
"$work/gd2fs" up --dir "$work/data" --listen "127.0.0.1:$pm" --port "$base" --resp-port 0 \
  --mem 64MiB --disk 1GiB --kv-mem 16MiB --kv-disk 256MiB >"$work/up.log" 2>&1 &
pids+=($!)
"$work/gd2fs" server --master "$master" --listen "127.0.0.1:$px" --mem 64MiB --disk "$work/extra:1GiB" \
  --kv-mem 16MiB >"$work/extra.log" 2>&1 &
extra=$!
pids+=($extra)

sed -E 's/^( *)for: .*/\1for: 0s/' deploy/prometheus/gd2fs-alerts.yml > "$work/rules.yml"
cat > "$work/prometheus.yml" <<EOC
global: {scrape_interval: 1s, evaluation_interval: 1s, scrape_timeout: 900ms}
rule_files: ["$work/rules.yml"]
scrape_configs:
  - job_name: gd2fs-master
    static_configs: [{targets: ["127.0.0.1:$pm"]}]
  - job_name: gd2fs-server
    static_configs: [{targets: ["127.0.0.1:$base", "127.0.0.1:$((base + 1))", "127.0.0.1:$((base + 2))", "127.0.0.1:$px"]}]
EOC
promtool check config "$work/prometheus.yml" >/dev/null || fail "promtool check config"
prometheus --config.file "$work/prometheus.yml" --storage.tsdb.path "$work/tsdb" \
  --web.listen-address "127.0.0.1:$pp" --log.level warn >"$work/prom.log" 2>&1 &
pids+=($!)
prom="http://127.0.0.1:$pp"
q() { curl -sf --max-time 5 --data-urlencode "query=$1" "$prom/api/v1/query"; }
until_ok() { # seconds, description, command...
  local n=$(( $1 * 10 )) what=$2; shift 2
  for _ in $(seq 1 "$n"); do "$@" && return 0; sleep 0.1; done
  echo "--- up.log"; tail -5 "$work/up.log"; echo "--- prometheus"; tail -5 "$work/prom.log"
  fail "$what"
}
ready() { [ "$(curl -s -o /dev/null -w '%{http_code}' "$1/readyz")" = 200 ]; }
allready() { for u in "$master" "http://127.0.0.1:$base" "http://127.0.0.1:$((base + 1))" "http://127.0.0.1:$((base + 2))" "http://127.0.0.1:$px"; do ready "$u" || return 1; done; }
until_ok 30 "the cluster was not ready within 30s" allready
targets_up() { [ "$(q 'count(up == 1)' | jq -r '.data.result[0].value[1] // 0')" = 5 ]; }
until_ok 30 "Prometheus did not see all 5 targets up within 30s" targets_up
servers_up() { [ "$(q 'sum(gd2fs_master_server_up)' | jq -r '.data.result[0].value[1] // 0')" = 4 ]; }
until_ok 20 "the master's gd2fs_master_server_up did not reach 4" servers_up

# HA data, chunks of 1 MiB over four servers until the extra one holds some.
head -c $((8 << 20)) /dev/urandom > "$work/f.bin"
holds() { [ "$(curl -s "http://127.0.0.1:$px/metrics" | awk '/^gd2fs_server_chunks /{print $2}')" != 0 ]; }
for i in 1 2 3 4; do
  GD2FS_MASTER=$master "$work/gd2fs" cp --chunk-size 1MiB "$work/f.bin" "gd2fs://local/ops/f$i.bin" >/dev/null
  holds && break
done
holds || fail "the extra server holds no chunk after 32 HA chunks"
# Two rule evaluations that began after the cluster was whole and held
# data (1 s apart), not a sleep: Prometheus says when it evaluated.
t0=$(date +%s)
evaluated() {
  curl -sf "$prom/api/v1/rules" | jq -e --argjson t "$((t0 + 1))" \
    '[.data.groups[].lastEvaluation | sub("\\.[0-9]+"; "") | fromdate] | all(. > $t)' >/dev/null
}
until_ok 20 "Prometheus did not evaluate the rules twice within 20s" evaluated
firing=$(curl -sf "$prom/api/v1/alerts" | jq -r '[.data.alerts[] | select(.state == "firing") | .labels.alertname] | join(" ")')
[ -z "$firing" ] || fail "alerts firing on a healthy cluster: $firing"
for m in gd2fs_build_info gd2fs_master_server_up gd2fs_master_leader gd2fs_master_leadership_changes_total \
    gd2fs_master_ha_replicas_missing gd2fs_server_tier_bytes gd2fs_kv_hits_total gd2fs_kv_misses_total \
    'gd2fs:disk_tier_used:ratio' 'gd2fs:kv_gets:rate10m'; do
  [ "$(q "count($m)" | jq -r '.data.result | length')" = 1 ] || fail "Prometheus has no $m"
done
echo "== Prometheus end to end: 5 targets up, the rules' metrics present, nothing firing on a healthy cluster"

xid=$(curl -s "http://127.0.0.1:$px/readyz" | jq -r .id)
{ kill -9 "$extra"; wait "$extra"; } 2>/dev/null || true
fired() {
  local a
  a=$(curl -sf "$prom/api/v1/alerts") || return 1
  echo "$a" | jq -e --arg id "$xid" '[.data.alerts[] | select(.state == "firing" and .labels.alertname == "GD2FSServerDown" and .labels.server == $id)] | length == 1' >/dev/null &&
    echo "$a" | jq -e '[.data.alerts[] | select(.state == "firing" and .labels.alertname == "GD2FSHAUnderReplicated")] | length == 1' >/dev/null
}
# The master marks it down after --down-after (5s); repair starts after 30s.
until_ok 25 "GD2FSServerDown for $xid and GD2FSHAUnderReplicated did not fire within 25s of the kill" fired
others=$(curl -sf "$prom/api/v1/alerts" | jq -r '[.data.alerts[] | select(.state == "firing") | .labels.alertname] | unique | join(" ")')
[ "$others" = "GD2FSHAUnderReplicated GD2FSServerDown" ] || fail "after the kill, firing: $others (want GD2FSHAUnderReplicated GD2FSServerDown)"
echo "== Prometheus end to end: server $xid SIGKILLed -> GD2FSServerDown{server=$xid} and GD2FSHAUnderReplicated fire"
