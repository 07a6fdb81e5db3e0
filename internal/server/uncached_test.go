package server_test

import (
	"bytes"
	"context"
	"io"
	"os"
	"path/filepath"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/gd2fs/gd2fs/client"
	"github.com/gd2fs/gd2fs/internal/cluster"
	"github.com/gd2fs/gd2fs/internal/testutil"
)

// TestPerfWriteUncached: a write to a one-replica chunk with a DRAM and a
// disk tier, not synced, goes to the chunk file past the page cache like a
// synced one (O_DIRECT from the DRAM pages: the page-cache copy was a third
// of a perf write's CPU), and the chunk file holds the bytes written.
func TestPerfWriteUncached(t *testing.T) {
	dir := t.TempDir()
	probe, err := os.OpenFile(filepath.Join(dir, "probe"), os.O_CREATE|os.O_WRONLY|unix.O_DIRECT, 0o600)
	if err != nil {
		t.Skipf("the file system under %s refuses O_DIRECT (%v): writes go through the page cache there", dir, err)
	}
	probe.Close()
	c, err := cluster.Start(context.Background(), cluster.Config{Dir: dir, Servers: 1, MemBytes: 8 << 20, DiskBytes: 64 << 20})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	cl := c.Client()
	defer cl.Close()
	data := testutil.RandomBytes(1<<20, 5)
	f, err := cl.Create(context.Background(), "/uncached", client.CreateOptions{Pool: "perf", ChunkSize: 4 << 20})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.Write(data); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	if n := c.Servers[0].Store().Stats().Syncs; n != 0 {
		t.Fatalf("a perf write was synced %d times: this test is about unsynced writes", n)
	}
	files, err := filepath.Glob(filepath.Join(dir, "*", "chunks", "*", "*.chunk"))
	if err != nil || len(files) != 1 {
		t.Fatalf("want one chunk file, found %v (%v)", files, err)
	}
	// The data region is the last len(data) bytes of the chunk file.
	cached, pages := residentPages(t, files[0], int64(len(data)))
	if cached > pages/4 {
		t.Fatalf("%d of %d pages of the chunk's bytes are in the page cache: the write was not uncached", cached, pages)
	}
	// The file's bytes are the bytes written (read through the page cache
	// now, from what O_DIRECT put on disk).
	raw, err := os.ReadFile(files[0])
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(raw[len(raw)-len(data):], data) {
		t.Fatal("the chunk file holds other bytes than the ones written")
	}
	r, err := cl.Open(context.Background(), "/uncached")
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	got, err := io.ReadAll(io.NewSectionReader(r, 0, r.Size()))
	if err != nil || !bytes.Equal(got, data) {
		t.Fatalf("the file reads back other bytes (%v)", err)
	}
}

// residentPages counts the pages of the last n bytes of file p that are
// in the page cache (mincore of a mapping).
func residentPages(t *testing.T, p string, n int64) (cached, pages int) {
	t.Helper()
	f, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		t.Fatal(err)
	}
	off := st.Size() - n
	if off < 0 || off%int64(os.Getpagesize()) != 0 {
		t.Fatalf("chunk file of %d bytes: its last %d bytes do not start on a page", st.Size(), n)
	}
	m, err := unix.Mmap(int(f.Fd()), off, int(n), unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Munmap(m)
	vec := make([]byte, (int(n)+os.Getpagesize()-1)/os.Getpagesize())
	if _, _, errno := unix.Syscall(unix.SYS_MINCORE, uintptr(unsafe.Pointer(&m[0])), uintptr(len(m)), uintptr(unsafe.Pointer(&vec[0]))); errno != 0 {
		t.Fatal(errno)
	}
	for _, v := range vec {
		cached += int(v & 1)
	}
	return cached, len(vec)
}
