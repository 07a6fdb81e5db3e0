package tier

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/gd2fs/gd2fs/internal/bufpool"
)

// TestNoTier: a nil DRAM or Disk answers as an empty tier, which is what
// lets the stores drop their branches on which tiers they have.
func TestNoTier(t *testing.T) {
	d, err := NewDRAM(0, 4096)
	if err != nil || d != nil {
		t.Fatalf("NewDRAM(0) = %v, %v; want nil, nil", d, err)
	}
	if d.Cap() != 0 || d.Used() != 0 || d.Pages() != 0 || d.FreePages() != 0 || d.Close() != nil {
		t.Fatal("no DRAM tier reports capacity or use")
	}
	if _, ok := d.Alloc(1); ok {
		t.Fatal("no DRAM tier allocated a page")
	}
	k := NewDisk("", 1<<30, nil)
	if k != nil {
		t.Fatalf("NewDisk(\"\") = %v; want nil", k)
	}
	k.Add(5)
	if k.Cap() != 0 || k.Used() != 0 || k.UsedOnFS() != 0 || k.Dir() != "" || !k.Fits(1<<62) {
		t.Fatal("no disk tier reports capacity or use, or refuses bytes")
	}
}

func TestDRAMAccounting(t *testing.T) {
	d, err := NewDRAM(10*4096+100, 4096) // rounded down to 10 pages
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	if d.Cap() != 10*4096 || d.Used() != 0 || d.PagesFor(4097) != 2 || d.PagesFor(0) != 0 {
		t.Fatalf("cap %d used %d PagesFor(4097) %d", d.Cap(), d.Used(), d.PagesFor(4097))
	}
	ps, ok := d.Alloc(3)
	if !ok || d.Used() != 3*4096 {
		t.Fatalf("after 3 pages: ok %v used %d", ok, d.Used())
	}
	if _, ok := d.Alloc(8); ok || d.Used() != 3*4096 {
		t.Fatal("an allocation past capacity succeeded or changed the use")
	}
	// Scatter several buffers, gather them back across page boundaries.
	a, b := bytes.Repeat([]byte{1}, 5000), bytes.Repeat([]byte{2}, 3000)
	d.CopyIn(ps, 100, a, b)
	got := make([]byte, 8000)
	if n := d.CopyOut(got, ps, 100); n != 8000 || !bytes.Equal(got, append(append([]byte(nil), a...), b...)) {
		t.Fatal("CopyOut does not return what CopyIn wrote")
	}
	d.Zero(ps, 200, 300)
	d.CopyOut(got[:200], ps, 150)
	if got[49] != 1 || got[50] != 0 || got[149] != 0 || got[150] != 1 {
		t.Fatalf("Zero cleared the wrong bytes: %v", got[45:155])
	}
	d.Release(ps)
	if d.Used() != 0 {
		t.Fatalf("used %d after release", d.Used())
	}
}

func TestDiskAccounting(t *testing.T) {
	dir := t.TempDir()
	k := NewDisk(dir, 100, nil)
	if k.Dir() != dir || k.Cap() != 100 {
		t.Fatal("dir or capacity lost")
	}
	if !k.Fits(100) || k.Fits(101) {
		t.Fatal("Fits is off at the capacity")
	}
	k.Add(60)
	if k.Used() != 60 || k.Fits(41) || !k.Fits(40) {
		t.Fatalf("used %d", k.Used())
	}
	if k.UsedOnFS() < 60 {
		t.Fatalf("UsedOnFS %d below what is counted", k.UsedOnFS())
	}
	// A tier larger than its file system counts what it cannot hold as used.
	huge := NewDisk(dir, 1<<60, nil)
	if huge.UsedOnFS() == 0 {
		t.Fatal("a 1 EiB tier on this file system reports nothing used")
	}
}

// TestReadPooled: a read past the end of a file is ErrShort (a torn write),
// not data and not a plain I/O error.
func TestReadPooled(t *testing.T) {
	p := filepath.Join(t.TempDir(), "f")
	if err := os.WriteFile(p, []byte("0123456789"), 0o600); err != nil {
		t.Fatal(err)
	}
	f, err := OS{}.OpenFile(p, os.O_RDONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	bp, err := ReadPooled(f, 2, 5)
	if err != nil || string(*bp) != "23456" {
		t.Fatalf("ReadPooled = %q, %v", *bp, err)
	}
	bufpool.Put(bp)
	if _, err := ReadPooled(f, 8, 5); !errors.Is(err, ErrShort) {
		t.Fatalf("read past the end: %v; want ErrShort", err)
	}
}

func TestIsFull(t *testing.T) {
	if !IsFull(&os.PathError{Op: "write", Path: "x", Err: unix.ENOSPC}) || IsFull(os.ErrNotExist) {
		t.Fatal("IsFull misclassifies")
	}
}

// TestPwritevEmptyBuffers: empty buffers among the ones written are
// skipped (a trailing one made Pwritev loop for ever; it hangs without the
// fix, and go test's -timeout fails it).
func TestPwritevEmptyBuffers(t *testing.T) {
	f, err := os.Create(t.TempDir() + "/f")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	n, err := Pwritev(f, [][]byte{{}, []byte("ab"), {}, []byte("cd"), {}}, 3)
	if err != nil || n != 4 {
		t.Fatalf("pwritev: %d bytes, %v", n, err)
	}
	got := make([]byte, 7)
	if _, err := f.ReadAt(got, 0); err != nil || string(got[3:]) != "abcd" {
		t.Fatalf("file holds %q (%v)", got, err)
	}
}

// TestPrefaultClose: a prefault in progress is stopped by Close, which
// does not wait for the whole tier; Prefaulted is closed once it ended,
// and at once on a tier that never prefaulted (or none).
func TestPrefaultClose(t *testing.T) {
	var none *DRAM
	<-none.Prefaulted()
	none.Prefault(nil, "none")
	d, err := NewDRAM(1<<30, 64<<10)
	if err != nil {
		t.Fatal(err)
	}
	<-d.Prefaulted()
	d.Prefault(nil, "test")
	ps, ok := d.Alloc(2)
	if !ok {
		t.Fatal("alloc while prefaulting")
	}
	d.CopyIn(ps, 10, []byte("kept"))
	got := make([]byte, 4)
	if d.CopyOut(got, ps, 10); string(got) != "kept" {
		t.Fatalf("read %q while prefaulting", got)
	}
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	<-d.Prefaulted()
}
