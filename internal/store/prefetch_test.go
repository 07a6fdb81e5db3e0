package store

import (
	"bytes"
	"errors"
	"testing"

	"github.com/gd2fs/gd2fs/errs"
)

// Prefetch brings a chunk that left DRAM back into it, so the next read is a
// DRAM read, without pinning it (reads of other chunks evict it again) and
// without counting a read.
func TestPrefetchPromotesUnpinned(t *testing.T) {
	const mb = 1 << 20
	s := open(t, Config{MemBytes: 2 * mb, Dir: t.TempDir(), DiskBytes: 64 * mb})
	data := map[uint64][]byte{}
	for id := uint64(1); id <= 3; id++ {
		data[id] = rnd(mb, id)
		if err := s.Write(id, 0, data[id]); err != nil {
			t.Fatal(err)
		}
	}
	// DRAM holds two 1 MiB chunks: reading 2 and 3 leaves 1 on disk only.
	readAll(t, s, 2, 0, mb)
	readAll(t, s, 3, 0, mb)
	before := s.Stats()
	readAll(t, s, 1, 0, mb)
	if st := s.Stats(); st.ReadPromotions != before.ReadPromotions+1 {
		t.Fatalf("chunk 1 should be on disk only: %+v -> %+v", before, st)
	}
	readAll(t, s, 2, 0, mb)
	readAll(t, s, 3, 0, mb) // chunk 1 out of DRAM again

	before = s.Stats()
	copied, err := s.Prefetch(1)
	if err != nil || !copied {
		t.Fatalf("prefetch: copied %v, %v", copied, err)
	}
	if st := s.Stats(); st.MemReads != before.MemReads || st.DiskReads != before.DiskReads || st.ReadPromotions != before.ReadPromotions {
		t.Fatalf("a prefetch counted a read: %+v -> %+v", before, st)
	}
	if again, err := s.Prefetch(1); err != nil || again {
		t.Fatalf("a second prefetch of a cached chunk copied %v, %v", again, err)
	}
	if got := readAll(t, s, 1, 0, mb); !bytes.Equal(got, data[1]) {
		t.Fatal("prefetched chunk reads other bytes")
	}
	if st := s.Stats(); st.MemReads != before.MemReads+1 || st.DiskReads != before.DiskReads || st.ReadPromotions != before.ReadPromotions {
		t.Fatalf("the read after a prefetch was not a DRAM read: %+v -> %+v", before, st)
	}
	// Not pinned: two other chunks' reads push it out.
	if _, err := s.Prefetch(1); err != nil {
		t.Fatal(err)
	}
	readAll(t, s, 2, 0, mb)
	readAll(t, s, 3, 0, mb)
	before = s.Stats()
	readAll(t, s, 1, 0, mb)
	if st := s.Stats(); st.ReadPromotions != before.ReadPromotions+1 {
		t.Fatalf("a prefetched chunk stayed in DRAM past two other chunks' reads (pinned?): %+v -> %+v", before, st)
	}
	if _, err := s.Prefetch(99); !errors.Is(err, errs.ErrNotFound) {
		t.Fatalf("prefetch of a missing chunk: %v, want not found", err)
	}
	// Without a disk tier there is nothing to bring in.
	m := open(t, Config{MemBytes: 2 * mb})
	if err := m.Write(1, 0, data[1]); err != nil {
		t.Fatal(err)
	}
	if copied, err := m.Prefetch(1); err != nil || copied {
		t.Fatalf("DRAM-only store: copied %v, %v", copied, err)
	}
}
