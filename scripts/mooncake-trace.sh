#!/usr/bin/env bash
# Fetch a public Mooncake trace (FAST'25; kvcache-ai/Mooncake, FAST25-release/traces/)
# that docs/kv-cache.md and docs/benchmarks.md replay, at the commit they were measured on,
# and check it.
#
#   bash scripts/mooncake-trace.sh [OUT]                       # conversation_trace.jsonl (12,031 requests)
#   bash scripts/mooncake-trace.sh --trace toolagent [OUT]     # toolagent_trace.jsonl (23,608 requests)
#   ./gd2fs-bench kv-trace --trace conversation_trace.jsonl --fractions 0.1 --disk 1 --policy auto,lru
#
# Both files are checked by their git blob id (what GitHub's tree lists); the conversation
# trace also by the sha256 of the copy its figures were measured on. Needs network access to
# raw.githubusercontent.com (the traces are not vendored here).
set -euo pipefail
if [[ "${1:-}" == "-h" || "${1:-}" == "--help" ]]; then
  sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//'
  exit 0
fi
name=conversation
if [[ "${1:-}" == "--trace" ]]; then
  name=${2:-}
  shift 2 || { echo "--trace needs conversation or toolagent" >&2; exit 1; }
fi
commit=a2a4b18ac537fd798d50e6e9f57031ce86419a37
case "$name" in
  conversation)
    blob=5a371794b81d7fc7487ec8a02a2c631bcc7fbdf8
    want=b8cbb061a85206d729d91cdc2981f43c9e0d99209dce588d3af5f7934408b9df # 3,029,533 bytes, 12,031 requests
    ;;
  toolagent)
    blob=b765599d1e0828b37f68d481563c385d3c11de54 # 23,608 requests
    want=                                          # no copy measured here yet: see docs/kv-cache.md
    ;;
  *) echo "--trace $name: want conversation or toolagent" >&2; exit 1 ;;
esac
out=${1:-${name}_trace.jsonl}
url=https://raw.githubusercontent.com/kvcache-ai/Mooncake/$commit/FAST25-release/traces/${name}_trace.jsonl
echo "fetching $url" >&2
curl -fL --retry 3 -o "$out.tmp" "$url" || { echo "download failed: is raw.githubusercontent.com reachable from here?" >&2; exit 1; }
# A git blob id is the SHA-1 of "blob <size>\0" followed by the bytes.
gotblob=$({ printf 'blob %d\0' "$(stat -c %s "$out.tmp")"; cat "$out.tmp"; } | sha1sum | cut -d' ' -f1)
if [[ "$gotblob" != "$blob" ]]; then
  echo "git blob id $gotblob differs from the file at $commit ($blob): not the trace measured; left in $out.tmp" >&2
  exit 2
fi
got=$(sha256sum "$out.tmp" | cut -d' ' -f1)
mv "$out.tmp" "$out"
if [[ -n "$want" && "$got" != "$want" ]]; then
  echo "warning: sha256 $got differs from the copy the recorded figures were measured on ($want)" >&2
  exit 2
fi
echo "$out: $(wc -l <"$out") requests, git blob id ok, sha256 $got" >&2
