#!/usr/bin/env bash
# Fetch the public Mooncake conversation trace (FAST'25; kvcache-ai/Mooncake,
# FAST25-release/traces/conversation_trace.jsonl) that docs/kv-cache.md and
# docs/benchmarks.md replay, at the commit they were measured on, and check it.
#
#   bash scripts/mooncake-trace.sh [OUT]      # default OUT: ./conversation_trace.jsonl
#   ./gd2fs-bench kv-trace --trace conversation_trace.jsonl --fractions 0.05,0.1,0.25
#
# Needs network access to raw.githubusercontent.com (the trace is not vendored here).
set -euo pipefail
if [[ "${1:-}" == "-h" || "${1:-}" == "--help" ]]; then
  sed -n '2,9p' "$0" | sed 's/^# \{0,1\}//'
  exit 0
fi
out=${1:-conversation_trace.jsonl}
commit=a2a4b18ac537fd798d50e6e9f57031ce86419a37
url=https://raw.githubusercontent.com/kvcache-ai/Mooncake/$commit/FAST25-release/traces/conversation_trace.jsonl
want=b8cbb061a85206d729d91cdc2981f43c9e0d99209dce588d3af5f7934408b9df # 3,029,533 bytes, 12,031 requests
echo "fetching $url" >&2
curl -fL --retry 3 -o "$out.tmp" "$url" || { echo "download failed: is raw.githubusercontent.com reachable from here?" >&2; exit 1; }
got=$(sha256sum "$out.tmp" | cut -d' ' -f1)
mv "$out.tmp" "$out"
if [[ "$got" != "$want" ]]; then
  echo "warning: sha256 $got differs from the copy the recorded figures were measured on ($want)" >&2
  exit 2
fi
echo "$out: $(wc -l <"$out") requests, sha256 ok" >&2
