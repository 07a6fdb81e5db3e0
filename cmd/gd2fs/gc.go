package main

import (
	"bufio"
	"bytes"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"runtime/debug"
	"strconv"
	"strings"
)

// masterGCPercent is the master's GOGC when the environment sets none. The
// leader keeps its sessions on the Go heap (100,000 sessions: ~126 MB live),
// and at 100 the collector marked all of it every 2.4 s at 3,000 turns/s:
// 9 % of the master's CPU, 4 % more in mallocgc (docs/benchmarks.md,
// "Thirteenth session"). At 200 it marks half as often, for a heap that may
// grow to 3x its live bytes instead of 2x; the memory limit below keeps a
// container's master from being killed for it.
const masterGCPercent = 200

// The soft limit (GOMEMLIMIT) counts the memory the Go runtime manages:
// heap, stacks, its own metadata. What it leaves of a cgroup's limit must
// hold the rest the cgroup is charged for: SQLite's page cache (64 MiB,
// allocated outside the Go heap), the kernel's page cache of meta.db and
// its WAL, the binary. So it is the limit less a tenth of it, and less at
// least memLimitReserve; under memLimitFloor left, no soft limit is set.
const (
	memLimitReserve = 128 << 20
	memLimitFloor   = 64 << 20
)

// softMemLimit is the soft limit for a cgroup memory limit, ok false when
// too little would be left for the Go runtime.
func softMemLimit(cgroup int64) (int64, bool) {
	soft := cgroup - max(cgroup/10, memLimitReserve)
	return soft, soft >= memLimitFloor
}

// masterGCHelp is the master's help on the collector's settings.
const masterGCHelp = `The master runs Go's collector at GOGC=200 (half the collections of the
default, for a heap of up to 3x the sessions it keeps live) and, under a
cgroup memory limit (a container's, a systemd MemoryMax=), with a soft
limit on the Go runtime's memory of that limit less a tenth (at least
128 MiB), so that it collects harder near the limit instead of being
killed. GOGC in the environment replaces the first, GOMEMLIMIT the second;
the master logs what it set. (gd2fs up, whose servers share its process,
keeps Go's defaults.)`

// tuneMasterGC applies masterGCPercent unless GOGC is set and a soft memory
// limit under the cgroup's (read below root, given /proc/self/cgroup's
// content) unless GOMEMLIMIT is set, and logs what it set.
func tuneMasterGC(log *slog.Logger, root string, procCgroup []byte) {
	var set []any
	if os.Getenv("GOGC") == "" {
		debug.SetGCPercent(masterGCPercent)
		set = append(set, "gogc", masterGCPercent)
	}
	if os.Getenv("GOMEMLIMIT") == "" {
		if lim, where, ok := cgroupMemoryLimit(root, procCgroup); ok {
			if soft, ok := softMemLimit(lim); ok {
				debug.SetMemoryLimit(soft)
				set = append(set, "memory_limit", soft, "cgroup_limit", lim, "cgroup", where)
			}
		}
	}
	if len(set) > 0 {
		log.Info("Go collector set for the master (GOGC and GOMEMLIMIT in the environment replace these)", set...)
	}
}

// cgroupMemoryLimit is the smallest memory limit on the process's cgroup
// and its ancestors, under root (the cgroup file system's mount), given
// the content of /proc/self/cgroup: cgroup v2's memory.max, or v1's
// memory/memory.limit_in_bytes. ok is false when no limit is set ("max",
// or v1's page-rounded 2^63) or none can be read: outside a container,
// usually.
func cgroupMemoryLimit(root string, procCgroup []byte) (limit int64, where string, ok bool) {
	sc := bufio.NewScanner(bytes.NewReader(procCgroup))
	for sc.Scan() {
		// v2: "0::/system.slice/gd2fs-master.service"; v1: "9:memory:/docker/abc".
		parts := strings.SplitN(sc.Text(), ":", 3)
		if len(parts) != 3 {
			continue
		}
		var dir, file string
		switch {
		case parts[0] == "0" && parts[1] == "":
			dir, file = root, "memory.max"
		case containsWord(parts[1], "memory"):
			dir, file = filepath.Join(root, "memory"), "memory.limit_in_bytes"
		default:
			continue
		}
		// In a container's cgroup namespace the path is "/" and root is its
		// own cgroup; on a host it is the unit's path below root. Walk up
		// from it: a parent's limit bounds the child too.
		rel := filepath.Clean("/" + parts[2])
		for {
			if v, err := readLimit(filepath.Join(dir, rel, file)); err == nil && v > 0 && (!ok || v < limit) {
				limit, where, ok = v, filepath.Join(dir, rel), true
			}
			if rel == "/" {
				break
			}
			rel = filepath.Dir(rel)
		}
	}
	return limit, where, ok
}

// readLimit reads a cgroup memory limit file: a byte count, or "max" (and
// v1's near-2^63 values) for none, which reads as 0.
func readLimit(path string) (int64, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	s := strings.TrimSpace(string(b))
	if s == "max" {
		return 0, nil
	}
	v, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("%s: %q is not a byte count", path, s)
	}
	if v >= 1<<62 { // v1's "no limit" is 2^63 rounded down to a page
		return 0, nil
	}
	return v, nil
}

// containsWord says whether the comma-separated list has w (v1's
// controllers field: "cpu,cpuacct", "memory").
func containsWord(list, w string) bool {
	for _, x := range strings.Split(list, ",") {
		if x == w {
			return true
		}
	}
	return false
}
