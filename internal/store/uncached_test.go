package store

import (
	"bytes"
	"os"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/gd2fs/gd2fs/internal/crc32c"
)

// TestUncachedWrite: a zero-copy write marked Uncached (the server does so
// for a write it syncs next) reaches the chunk file past the page cache,
// reads back the same from disk after the DRAM copy is gone, survives a
// reopen and a Sync; an unaligned one is written as usual.
func TestUncachedWrite(t *testing.T) {
	dir := t.TempDir()
	s := open(t, Config{MemBytes: 8 << 20, Dir: dir, DiskBytes: 64 << 20})
	put := func(id uint64, off int64, p []byte) {
		t.Helper()
		dst, pw, ok := s.BeginWrite(id, off, len(p))
		if !ok {
			t.Fatalf("chunk %d: no zero-copy write", id)
		}
		rest := p
		for _, d := range dst {
			rest = rest[copy(d, rest):]
		}
		pw.Uncached()
		if err := pw.Commit(crc32c.Checksum(p)); err != nil {
			t.Fatal(err)
		}
		if err := s.Sync(id); err != nil {
			t.Fatal(err)
		}
	}
	a := rnd(256<<10, 1)
	put(1, 0, a)
	odd := rnd(10_000, 2) // not a multiple of 4 KiB: the page cache
	put(2, 0, odd)

	f, err := os.Open(s.path(1))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	m, err := unix.Mmap(int(f.Fd()), dataOff, len(a), unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	vec := make([]byte, (len(a)+os.Getpagesize()-1)/os.Getpagesize())
	_, _, errno := unix.Syscall(unix.SYS_MINCORE, uintptr(unsafe.Pointer(&m[0])), uintptr(len(m)), uintptr(unsafe.Pointer(&vec[0])))
	unix.Munmap(m)
	if errno != 0 {
		t.Fatal(errno)
	}
	cached := 0
	for _, v := range vec {
		cached += int(v & 1)
	}
	probe, perr := os.OpenFile(s.path(1), os.O_WRONLY|unix.O_DIRECT, 0)
	if perr == nil {
		probe.Close()
	}
	if perr != nil {
		t.Logf("the file system under %s refuses O_DIRECT: the write went through the page cache", dir)
	} else if cached > len(vec)/2 {
		t.Fatalf("%d of %d pages of an uncached write are in the page cache", cached, len(vec))
	}

	// The bytes on disk are the bytes written: drop DRAM, reopen, read.
	s2 := open(t, Config{Dir: dir, DiskBytes: 64 << 20})
	if got := readAll(t, s2, 1, 0, int64(len(a))); !bytes.Equal(got, a) {
		t.Fatal("uncached write reads back other bytes from disk")
	}
	if got := readAll(t, s2, 2, 0, int64(len(odd))); !bytes.Equal(got, odd) {
		t.Fatal("unaligned write reads back other bytes from disk")
	}
}
