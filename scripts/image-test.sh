#!/usr/bin/env bash
# Builds the container image (scripts/image.sh) and checks it: entrypoint,
# non-root user, size, labels, no :latest tag, and `--version` run inside
# it. Then, when podman can run containers here, runs a master and three
# data servers as containers (host network, loopback addresses only), waits
# for their /readyz, writes a file into the cluster from a client container
# and reads it back byte for byte. Where containers cannot run it prints
# why and passes on the build and the inspection alone.
#
#   bash scripts/image-test.sh            (called by scripts/test.sh; ~30 s)
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v podman >/dev/null 2>&1; then
  echo "== SKIP image: podman is not installed (apt-get install podman buildah)"; exit 0
fi
fail() { echo "image-test: FAIL: $*" >&2; exit 1; }

if ! tag=$(bash scripts/image.sh 2>"${TMPDIR:-/tmp}/gd2fs-image-build.$$"); then
  err=$(tail -3 "${TMPDIR:-/tmp}/gd2fs-image-build.$$"); rm -f "${TMPDIR:-/tmp}/gd2fs-image-build.$$"
  # Our Containerfile, or a machine that cannot build images at all (no
  # storage driver, no user namespaces)? An empty scratch container says.
  if command -v buildah >/dev/null 2>&1 && ! c=$(buildah from scratch 2>&1); then
    echo "== SKIP image: this machine cannot build images (buildah from scratch: $(echo "$c" | tail -1)); image.sh said: $err"; exit 0
  fi
  [ -n "${c:-}" ] && buildah rm "$c" >/dev/null 2>&1
  fail "scripts/image.sh: $err"
fi
rm -f "${TMPDIR:-/tmp}/gd2fs-image-build.$$"
version=$(tr -d '[:space:]' < internal/version/VERSION)
[ "$tag" = "localhost/gd2fs:$version" ] || [ -n "${IMAGE:-}" ] || fail "tag $tag, want localhost/gd2fs:$version"
case "$tag" in *:latest) fail "the image is tagged latest";; esac
read -r entry user size < <(podman image inspect "$tag" --format '{{json .Config.Entrypoint}} {{.Config.User}} {{.Size}}')
[ "$entry" = '["/usr/bin/gd2fs"]' ] || fail "entrypoint $entry"
[ "$user" = "65532:65532" ] || fail "user $user (want the non-root 65532:65532)"
max=$((64 << 20))
[ "$size" -le "$max" ] || fail "image is $size bytes, more than $max"
rev=$(podman image inspect "$tag" --format '{{index .Config.Labels "org.opencontainers.image.version"}}')
[ "$rev" = "$version" ] || fail "label version $rev, want $version"
layers=$(podman image inspect "$tag" --format '{{len .RootFS.Layers}}')
echo "== image $tag: entrypoint $entry, user $user, $((size / 1024 / 1024)) MiB, $layers layers"

# How containers run here: some sandboxes refuse raising rlimits (crun's
# default nofile) or hybrid cgroups (crun); runc with lowered limits works.
run_opts=()
runs=false
why=""
for rt in "" runc; do
  opts=(--network host --ulimit nofile=8192:8192 --ulimit nproc=8192:8192)
  if [ -n "$rt" ]; then
    command -v "$rt" >/dev/null 2>&1 || continue
    opts=(--runtime "$rt" "${opts[@]}")
  fi
  if out=$(podman run --rm "${opts[@]}" "$tag" --version 2>&1); then
    run_opts=("${opts[@]}"); runs=true; break
  fi
  why="$why${rt:-default runtime}: $(echo "$out" | tail -1); "
done
if ! $runs; then
  echo "== SKIP image run: podman cannot run containers here ($why). Build and inspection passed."
  exit 0
fi
want="gd2fs $version "
case "$out" in "$want"*) ;; *) fail "--version in the image printed '$out', want '$want...'";; esac
echo "== image runs (${run_opts[*]}): $out"

work=$(mktemp -d /tmp/gd2fs-image-test.XXXXXX)
names=()
cleanup() {
  for n in "${names[@]}"; do podman rm -f -t 2 "$n" >/dev/null 2>&1 || true; done
  rm -rf "$work"
}
trap cleanup EXIT
ports=$(/usr/bin/python3 - <<'PY'
import socket
ss = [socket.socket() for _ in range(4)]
for s in ss: s.bind(("127.0.0.1", 0))
print(" ".join(str(s.getsockname()[1]) for s in ss))
PY
)
read -r pm p1 p2 p3 <<<"$ports"
master="http://127.0.0.1:$pm"
for d in m s1 s2 s3 io; do mkdir -p "$work/$d"; done
chown -R 65532:65532 "$work" 2>/dev/null || chmod -R 0777 "$work"
id=$$
start() { # name, volume, args...
  local n=gd2fs-image-test-$id-$1 v=$2; shift 2
  names+=("$n")
  podman run -d --name "$n" "${run_opts[@]}" -v "$v:/var/lib/gd2fs" "$tag" "$@" >/dev/null
}
start m "$work/m" master --listen "127.0.0.1:$pm" --meta sqlite:///var/lib/gd2fs/meta.db
i=0
for p in $p1 $p2 $p3; do
  i=$((i + 1))
  start "s$i" "$work/s$i" server --master "$master" --listen "127.0.0.1:$p" --mem 64MiB --disk "/var/lib/gd2fs/disk:256MiB" --kv-mem 16MiB
done
ready() { [ "$(curl -s -o /dev/null -w '%{http_code}' "$1/readyz")" = 200 ]; }
for i in $(seq 1 300); do
  ok=true
  for u in "$master" "http://127.0.0.1:$p1" "http://127.0.0.1:$p2" "http://127.0.0.1:$p3"; do ready "$u" || ok=false; done
  $ok && break
  sleep 0.1
done
if ! $ok; then
  for n in "${names[@]}"; do echo "--- $n"; podman logs "$n" 2>&1 | tail -5; done
  fail "the containers were not all ready within 30s"
fi
head -c $((40 << 20)) /dev/urandom > "$work/io/in.bin"
chown 65532:65532 "$work/io/in.bin" 2>/dev/null || true
client=(podman run --rm "${run_opts[@]}" -v "$work/io:/io" "$tag" --master "$master")
"${client[@]}" cp --chunk-size 8MiB /io/in.bin gd2fs://local/image-test/in.bin
"${client[@]}" cat gd2fs://local/image-test/in.bin > "$work/out.bin"
cmp "$work/io/in.bin" "$work/out.bin" || fail "the file read back differs from the one written"
up=$(curl -s "$master/metrics" | awk '/^gd2fs_master_servers_up /{print $2}')
[ "$up" = 3 ] || fail "the master sees $up servers up, want 3"
echo "== image cluster: master + 3 servers in containers, 40 MiB round-tripped (ha pool), all /readyz 200"
