#!/usr/bin/env bash
# Builds the gd2fs container image offline (Containerfile, FROM scratch):
# a static gd2fs (CGO_ENABLED=0, -trimpath, version and commit stamped with
# -ldflags), the system CA bundle, a passwd entry for uid 65532, and an empty
# /var/lib/gd2fs owned by it. Uses buildah when present, else podman.
#
#   bash scripts/image.sh                        # tags localhost/gd2fs:<version>
#   IMAGE=registry.example/gd2fs bash scripts/image.sh
#   bash scripts/image.sh --print-tag            # only print the tag it would build
#
# Never tags :latest (the Helm chart pins a version; so should you).
set -euo pipefail
cd "$(dirname "$0")/.."
version=$(tr -d '[:space:]' < internal/version/VERSION)
commit=$(git rev-parse HEAD 2>/dev/null || echo unknown)
if [ -n "$(git status --porcelain --untracked-files=no 2>/dev/null)" ]; then commit="$commit+dirty"; fi
image=${IMAGE:-localhost/gd2fs}
tag="$image:$version"
if [ "${1:-}" = "--print-tag" ]; then echo "$tag"; exit 0; fi

ctx=$(mktemp -d /tmp/gd2fs-image.XXXXXX)
trap 'rm -rf "$ctx"' EXIT
CGO_ENABLED=0 go build -trimpath \
  -ldflags "-s -w -X github.com/gd2fs/gd2fs/internal/version.commit=$commit" \
  -o "$ctx/gd2fs" ./cmd/gd2fs
chmod 0755 "$ctx/gd2fs"
if [ -r /etc/ssl/certs/ca-certificates.crt ]; then
  cp /etc/ssl/certs/ca-certificates.crt "$ctx/"
else
  echo "image.sh: no /etc/ssl/certs/ca-certificates.crt here (Debian's ca-certificates); the image has no system roots" >&2
  : > "$ctx/ca-certificates.crt"
fi
printf 'gd2fs:x:65532:65532:gd2fs:/var/lib/gd2fs:/nonexistent\n' > "$ctx/passwd"
printf 'gd2fs:x:65532:\n' > "$ctx/group"
mkdir -p "$ctx/var/lib/gd2fs"
cp Containerfile "$ctx/"

args=(--build-arg "VERSION=$version" --build-arg "COMMIT=$commit" -f "$ctx/Containerfile" -t "$tag" "$ctx")
if command -v buildah >/dev/null 2>&1; then
  buildah bud -q --pull=false "${args[@]}" >/dev/null
elif command -v podman >/dev/null 2>&1; then
  podman build -q --pull=false "${args[@]}" >/dev/null
else
  echo "image.sh: neither buildah nor podman is installed (apt-get install buildah)" >&2
  exit 1
fi
echo "$tag"
