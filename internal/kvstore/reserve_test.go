package kvstore

import (
	"bytes"
	"errors"
	"testing"

	"github.com/gd2fs/gd2fs/errs"
	"github.com/gd2fs/gd2fs/internal/crc32c"
)

// fill copies v into a reservation's views, as a socket read would.
func fill(t *testing.T, r *Reservation, v []byte) uint32 {
	t.Helper()
	off := 0
	for _, b := range r.Views() {
		off += copy(b, v[off:])
	}
	if off != len(v) || r.Size() != int64(len(v)) {
		t.Fatalf("the views hold %d bytes of %d (size %d)", off, len(v), r.Size())
	}
	return crc32c.Checksum(v)
}

// TestReservation: a value filled into reserved pages reads back as put
// (bytes and CRC) and replaces or keeps an existing block by Put's rules;
// Release and a lost race give the pages back; reservations hold at most a
// quarter of the tier; the store's Close leaves the pages of an open
// reservation mapped, and its Commit then fails.
func TestReservation(t *testing.T) {
	s := open(t, Config{MemBytes: 4 << 20})
	used := func() int64 { return s.Stats().MemUsed }

	v1 := val("k", 300<<10+5)
	r, err := s.Reserve([]byte("k"), int64(len(v1)), false)
	if err != nil || r == nil {
		t.Fatalf("reserve: %v %v", r, err)
	}
	if _, _, err := get(s, "k"); !errors.Is(err, errs.ErrNotFound) {
		t.Fatalf("a reserved, uncommitted key reads: %v", err)
	}
	if existed, err := r.Commit(fill(t, r, v1), false); err != nil || existed {
		t.Fatalf("commit: %v %v", existed, err)
	}
	if got, tier, err := get(s, "k"); err != nil || tier != TierDRAM || !bytes.Equal(got, v1) {
		t.Fatalf("the committed value: %v %v (%d bytes)", tier, err, len(got))
	}
	if _, err := r.Commit(0, true); err == nil {
		t.Fatal("a second commit of one reservation succeeded")
	}

	// Write-once over an existing key: no pages (Put keeps the key
	// without them); one reserved before the key arrived loses to it, the
	// old value stays and the pages go back.
	v2 := val("k2", 100<<10)
	if r, err := s.Reserve([]byte("k"), int64(len(v2)), false); r != nil || err != nil {
		t.Fatalf("a write-once reservation of a key there: %v %v", r, err)
	}
	r, _ = s.Reserve([]byte("w"), int64(len(v2)), false)
	if _, err := s.Put([]byte("w"), v1, false); err != nil {
		t.Fatal(err)
	}
	before := used()
	if existed, err := r.Commit(fill(t, r, v2), false); err != nil || !existed {
		t.Fatalf("write-once commit over a key: %v %v", existed, err)
	}
	if got, _, _ := get(s, "w"); !bytes.Equal(got, v1) {
		t.Fatal("a write-once commit replaced the value")
	}
	if used() >= before {
		t.Fatalf("the losing reservation's pages were kept: %d bytes used, %d before", used(), before)
	}
	// Overwrite replaces it.
	r, _ = s.Reserve([]byte("k"), int64(len(v2)), false)
	if r != nil {
		t.Fatal("a write-once reservation of a key there")
	}
	r, _ = s.Reserve([]byte("k"), int64(len(v2)), true)
	if existed, err := r.Commit(fill(t, r, v2), true); err != nil || existed {
		t.Fatalf("overwrite commit: %v %v", existed, err)
	}
	if got, _, _ := get(s, "k"); !bytes.Equal(got, v2) {
		t.Fatal("an overwrite commit kept the old value")
	}

	// Release gives the pages back; the key stays as it was.
	before = used()
	r, _ = s.Reserve([]byte("k"), 200<<10, true)
	if used() <= before {
		t.Fatal("a reservation holds no pages")
	}
	r.Release()
	r.Release() // a second Release does nothing
	if used() != before {
		t.Fatalf("released pages still used: %d, %d before", used(), before)
	}
	if got, _, _ := get(s, "k"); !bytes.Equal(got, v2) {
		t.Fatal("a released reservation changed the key")
	}

	// A quarter of the 4 MiB tier at most: the second 600 KiB is refused
	// (nil, no error: the caller puts the ordinary way).
	a, err := s.Reserve([]byte("a"), 600<<10, true)
	if err != nil || a == nil {
		t.Fatalf("first reservation: %v", err)
	}
	if b, err := s.Reserve([]byte("b"), 600<<10, true); b != nil || err != nil {
		t.Fatalf("reservations past a quarter of the tier: %v %v", b, err)
	}
	a.Release()
	if _, err := s.Reserve(nil, 1, true); err == nil {
		t.Fatal("an empty key reserved")
	}
	if _, err := s.Reserve([]byte("big"), s.cfg.MaxValue+1, true); !errors.Is(err, errs.ErrTooLarge) {
		t.Fatalf("a value over the limit: %v", err)
	}

	// Close with a reservation open: its pages stay writable, its commit fails.
	c := open(t, Config{MemBytes: 4 << 20})
	r, _ = c.Reserve([]byte("x"), 64<<10, true)
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	crc := fill(t, r, val("x", 64<<10)) // would fault on an unmapped tier
	if _, err := r.Commit(crc, true); !errors.Is(err, errs.ErrUnavailable) {
		t.Fatalf("commit after Close: %v", err)
	}
	if c.arenaAfterFills != nil {
		t.Fatal("the DRAM tier was not unmapped after the last reservation ended")
	}
}

// TestReservationWithoutDRAM: a store without a DRAM tier reserves nothing.
func TestReservationWithoutDRAM(t *testing.T) {
	s := open(t, Config{Dir: t.TempDir(), DiskBytes: 64 << 20})
	if r, err := s.Reserve([]byte("k"), 1<<20, true); r != nil || err != nil {
		t.Fatalf("reserve without DRAM: %v %v", r, err)
	}
}
