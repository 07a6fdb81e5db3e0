package kvstore

import (
	"fmt"
	"runtime"
	"testing"
)

// TestIndexBytesPerKey: the index of many 1-byte blocks is bounded by the
// disk tier (each record counts its index entry's RAM, indexCharge), and
// entryRAM is at least what an entry really costs (issue 22 finding 5).
func TestIndexBytesPerKey(t *testing.T) {
	const disk = 8 << 20
	s, err := Open(Config{Dir: t.TempDir(), DiskBytes: disk, SegmentSize: 1 << 20, MaxValue: 64 << 10})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	key := func(i int) []byte { return fmt.Appendf(nil, "lmcache/metadata/%08d", i) }
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	const n = 20000 // fits: 20000 * (256+25+24+26+1) < 8 MiB
	for i := range n {
		if _, err := s.Put(key(i), []byte{1}, true); err != nil {
			t.Fatal(err)
		}
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	perKey := float64(int64(after.HeapAlloc)-int64(before.HeapAlloc)) / n
	t.Logf("%d 1-byte blocks with %d-byte keys: %.0f bytes of heap each (charged %d)", n, len(key(0)), perKey, indexCharge(string(key(0))))
	if perKey > float64(indexCharge(string(key(0)))) {
		t.Errorf("an index entry costs %.0f bytes of heap, more than the %d charged: raise entryRAM", perKey, indexCharge(string(key(0))))
	}
	// Many more than the tier can index: the oldest go, the index stays
	// within DiskBytes / charge.
	for i := n; i < 20*n; i++ {
		if _, err := s.Put(key(i), []byte{1}, true); err != nil {
			t.Fatal(err)
		}
	}
	st := s.Stats()
	if limit := disk / indexCharge(string(key(0))); int64(st.Keys) > limit || st.DiskUsed > disk {
		t.Fatalf("%d keys indexed (limit %d), disk use %d of %d", st.Keys, limit, st.DiskUsed, disk)
	}
	if err := s.checkInvariants(); err != nil {
		t.Fatal(err)
	}
}
