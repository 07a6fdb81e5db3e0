// Package chaos is gd2fs's fault harness: it starts a cluster of real gd2fs
// processes (two masters on PostgreSQL, several data servers), each in its
// own network namespace on a bridge where the kernel allows it, runs a mixed
// load against it (HA and perf files, hash-mode KV, explicit sessions,
// files linked from an S3 server), injects faults on a printed schedule
// (SIGKILL and restart, SIGSTOP, partitions cut with nftables, a full disk,
// packet loss, delays and resets from its own TCP proxy) and checks
// invariants the whole time:
//
//   - no acknowledged HA write is ever lost or changed;
//   - no read ever returns wrong bytes (content is a pure function of the
//     file's path and the offset, so checking needs no memory of what was
//     written);
//   - perf-pool, KV and session data may go missing, but only as clean
//     misses or "unavailable" errors;
//   - every kind of operation succeeds again within a bound after each
//     fault heals (the recovery time is measured and reported);
//   - the processes that lived through the run hold no more goroutines or
//     file descriptors after it than before it.
//
// Wrong bytes and lost acknowledged writes are integrity violations and are
// always fatal; availability findings (no recovery within the bound, other
// errors, leaks) are fatal only with Config.Strict. The harness is run by
// cmd/gd2fs-chaos (scripts/chaos.sh) and is not linked into the gd2fs binary.
// docs/reliability.md explains every fault and invariant.
package chaos
