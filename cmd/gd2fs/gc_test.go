package main

import (
	"io"
	"log/slog"
	"math"
	"os"
	"path/filepath"
	"runtime/debug"
	"testing"
)

func TestCgroupMemoryLimit(t *testing.T) {
	write := func(t *testing.T, root, rel, file, v string) {
		t.Helper()
		dir := filepath.Join(root, rel)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, file), []byte(v+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	cases := []struct {
		name   string
		setup  func(t *testing.T, root string)
		cgroup string
		want   int64
		ok     bool
	}{
		{"v2 container, namespaced", func(t *testing.T, root string) {
			write(t, root, ".", "memory.max", "2147483648")
		}, "0::/\n", 2 << 30, true},
		{"v2 no limit", func(t *testing.T, root string) {
			write(t, root, ".", "memory.max", "max")
		}, "0::/\n", 0, false},
		{"v2 host unit under a smaller slice", func(t *testing.T, root string) {
			write(t, root, ".", "memory.max", "max")
			write(t, root, "system.slice", "memory.max", "1073741824")
			write(t, root, "system.slice/gd2fs-master.service", "memory.max", "4294967296")
		}, "0::/system.slice/gd2fs-master.service\n", 1 << 30, true},
		{"v1 with limit", func(t *testing.T, root string) {
			write(t, root, "memory/docker/abc", "memory.limit_in_bytes", "536870912")
			write(t, root, "memory", "memory.limit_in_bytes", "9223372036854771712")
		}, "9:cpu,cpuacct:/docker/abc\n4:memory:/docker/abc\n0::/\n", 512 << 20, true},
		{"v1 path not under root (a container's own hierarchy)", func(t *testing.T, root string) {
			write(t, root, "memory", "memory.limit_in_bytes", "805306368")
		}, "4:memory:/docker/abc\n", 768 << 20, true},
		{"v1 no limit", func(t *testing.T, root string) {
			write(t, root, "memory", "memory.limit_in_bytes", "9223372036854771712")
		}, "4:memory:/\n", 0, false},
		{"garbage in the file", func(t *testing.T, root string) {
			write(t, root, ".", "memory.max", "lots")
		}, "0::/\n", 0, false},
		{"no memory controller named", func(t *testing.T, root string) {
			write(t, root, "memory", "memory.limit_in_bytes", "805306368")
		}, "1:cpu:/\nnot a line\n", 0, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			root := t.TempDir()
			c.setup(t, root)
			got, where, ok := cgroupMemoryLimit(root, []byte(c.cgroup))
			if got != c.want || ok != c.ok {
				t.Fatalf("cgroupMemoryLimit = %d, %v (at %q); want %d, %v", got, ok, where, c.want, c.ok)
			}
		})
	}
}

func TestTuneMasterGCKeepsTheEnvironments(t *testing.T) {
	old := debug.SetGCPercent(100)
	oldLimit := debug.SetMemoryLimit(-1)
	defer func() {
		debug.SetGCPercent(old)
		debug.SetMemoryLimit(oldLimit)
	}()
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	root := t.TempDir()
	if err := os.WriteFile(filepath.Join(root, "memory.max"), []byte("2147483648\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	cg := []byte("0::/\n")
	const noLimit = math.MaxInt64

	t.Setenv("GOGC", "50")
	t.Setenv("GOMEMLIMIT", "1GiB")
	debug.SetMemoryLimit(noLimit)
	tuneMasterGC(log, root, cg)
	if p := debug.SetGCPercent(100); p != 100 {
		t.Fatalf("GOGC=50 in the environment, but the master set the collector to %d", p)
	}
	if l := debug.SetMemoryLimit(-1); l != noLimit {
		t.Fatalf("GOMEMLIMIT in the environment, but the master set the limit to %d", l)
	}

	os.Unsetenv("GOGC") // t.Setenv restores them
	os.Unsetenv("GOMEMLIMIT")
	tuneMasterGC(log, root, cg)
	if p := debug.SetGCPercent(100); p != masterGCPercent {
		t.Fatalf("no GOGC in the environment: collector at %d, want %d", p, masterGCPercent)
	}
	if l, want := debug.SetMemoryLimit(-1), int64(2<<30-(2<<30)/10); l != want {
		t.Fatalf("no GOMEMLIMIT under a 2 GiB cgroup: limit %d, want %d", l, want)
	}
}

func TestSoftMemLimit(t *testing.T) {
	for _, c := range []struct {
		cgroup, want int64
		ok           bool
	}{
		{2 << 30, 2<<30 - (2<<30)/10, true}, // a tenth
		{512 << 20, 384 << 20, true},        // at least 128 MiB left out
		{192 << 20, 64 << 20, true},
		{160 << 20, 0, false}, // too little left for the runtime: no soft limit
	} {
		got, ok := softMemLimit(c.cgroup)
		if ok != c.ok || (ok && got != c.want) {
			t.Errorf("softMemLimit(%d) = %d, %v; want %d, %v", c.cgroup, got, ok, c.want, c.ok)
		}
	}
}
