#!/usr/bin/env bash
# Builds the pygd2fs wheel (python3 -m build --wheel --no-isolation: Debian's
# python3-build, offline), checks that it bundles libgd2fs.so.1 and carries
# gd2fs's version (what `gd2fs --version` prints), installs it into a fresh
# venv with pip --no-index, and runs a smoke test from that venv against a
# `gd2fs up` on loopback: a file and a KV block written and read back.
#
#   bash scripts/wheel-test.sh            (called by scripts/test.sh; ~1 min)
#   WHEEL_OUT=dist bash scripts/wheel-test.sh   # keep the wheel in ./dist
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-/usr/bin/python3}
fail() { echo "wheel-test: FAIL: $*" >&2; exit 1; }
if ! "$PY" -c 'import build, setuptools, wheel' 2>/dev/null; then
  echo "== SKIP wheel: $PY lacks build/setuptools/wheel (apt-get install python3-build python3-setuptools python3-wheel)"; exit 0
fi
if ! "$PY" -c 'import ensurepip' 2>/dev/null; then
  echo "== SKIP wheel: $PY cannot make a venv with pip (apt-get install python3-venv)"; exit 0
fi
work=$(mktemp -d /tmp/gd2fs-wheel-test.XXXXXX)
up=""
cleanup() {
  if [ -n "$up" ]; then kill "$up" 2>/dev/null || true; wait "$up" 2>/dev/null || true; fi
  rm -rf "$work" python/build python/*.egg-info
}
trap cleanup EXIT
out=${WHEEL_OUT:-$work/dist}
go build -o "$work/gd2fs" ./cmd/gd2fs
gv=$("$work/gd2fs" --version | awk '{print $2}')
[ "$gv" = "$(tr -d '[:space:]' < internal/version/VERSION)" ] || fail "gd2fs --version says $gv, VERSION another"
"$PY" -m build --wheel --no-isolation --outdir "$out" python >"$work/build.log" 2>&1 || { tail -20 "$work/build.log"; fail "python3 -m build"; }
whl=$(ls "$out"/pygd2fs-"$gv"-*.whl 2>/dev/null | head -1)
[ -n "$whl" ] || fail "no pygd2fs-$gv-*.whl in $out: $(ls "$out")"
"$PY" - "$whl" <<'PY' || fail "wheel contents"
import sys, zipfile
names = zipfile.ZipFile(sys.argv[1]).namelist()
for want in ("pygd2fs/libgd2fs.so.1", "pygd2fs/_version.py", "pygd2fs/__init__.py"):
    assert want in names, f"{want} not in the wheel: {names}"
assert not any(n.endswith(".h") for n in names), names
PY
"$PY" -m venv "$work/venv"
"$work/venv/bin/pip" install -q --no-index --no-deps "$whl" || fail "pip install --no-index of the wheel"
read -r pm base < <("$PY" - <<'PY'
import random, socket
s = socket.socket(); s.bind(("127.0.0.1", 0)); pm = s.getsockname()[1]; s.close()
def free(p):
    t = socket.socket()
    try:
        t.bind(("127.0.0.1", p)); return True
    except OSError:
        return False
    finally:
        t.close()
while True:
    b = random.randint(30000, 40000)
    if all(free(b + i) for i in range(3)) and pm not in range(b, b + 3):
        break
print(pm, b)
PY
)
"$work/gd2fs" up --dir "$work/data" --listen "127.0.0.1:$pm" --port "$base" --resp-port 0 --mem 64MiB --disk 256MiB --kv-mem 32MiB --kv-disk 0 >"$work/up.log" 2>&1 &
up=$!
for _ in $(seq 1 300); do
  [ "$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$pm/readyz")" = 200 ] && \
    [ "$(curl -s "http://127.0.0.1:$pm/metrics" | awk '/^gd2fs_master_servers_up /{print $2}')" = 3 ] && break
  sleep 0.1
done
# From outside the checkout, so that only the installed wheel can be imported.
(cd "$work" && GD2FS_WANT_VERSION="$gv" GD2FS_MASTER="http://127.0.0.1:$pm" "$work/venv/bin/python" - <<'PY') || fail "smoke test in the venv"
import os, importlib.metadata, pygd2fs
want = os.environ["GD2FS_WANT_VERSION"]
assert pygd2fs.__version__ == want, (pygd2fs.__version__, want)
assert importlib.metadata.version("pygd2fs") == want
assert pygd2fs.__file__.startswith(os.path.dirname(os.path.dirname(os.__file__))) or "/venv/" in pygd2fs.__file__, pygd2fs.__file__
data = os.urandom(5 << 20)
with pygd2fs.connect(os.environ["GD2FS_MASTER"]) as c:
    assert c.write("/wheel/smoke.bin", data, pool="ha") == len(data)
    assert c.read("/wheel/smoke.bin") == data
    c.put("wheel-smoke-key", data[:4096])
    assert c.get("wheel-smoke-key") == data[:4096]
    print(f"== wheel: pygd2fs {pygd2fs.__version__} from {os.path.dirname(pygd2fs.__file__)}: 5 MiB file and a KV block round-tripped")
PY
echo "== wheel: $(basename "$whl") ($(( $(stat -c %s "$whl") / 1024 / 1024 )) MiB), version = gd2fs --version = $gv, installed offline into a fresh venv"
