#!/usr/bin/env bash
# Runs gd2fs's fault harness (cmd/gd2fs-chaos, docs/reliability.md): builds
# gd2fs and the harness, then runs a cluster of real processes in network
# namespaces (as root; loopback otherwise) under a mixed load and faults.
# Every argument goes to gd2fs-chaos; --help lists them.
#
#   bash scripts/chaos.sh --duration 3m --out report.md
#   GD2FS_TEST_POSTGRES=postgres://... bash scripts/chaos.sh --duration 60s --faults kill,pause,leader-partition
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p bin
go build -o bin/gd2fs ./cmd/gd2fs
go build -o bin/gd2fs-chaos ./cmd/gd2fs-chaos
exec bin/gd2fs-chaos --bin bin/gd2fs "$@"
