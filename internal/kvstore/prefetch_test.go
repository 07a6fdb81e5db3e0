package kvstore

import (
	"bytes"
	"fmt"
	"testing"
)

// TestPrefetchPromotesWithoutPinning: Prefetch brings a disk block into
// DRAM without counting a read; the block is still evictable (a DRAM's
// worth of new puts demotes it again); Exists never promotes.
func TestPrefetchPromotesWithoutPinning(t *testing.T) {
	for _, policy := range []string{"s3fifo", "lru"} {
		t.Run(policy, func(t *testing.T) {
			s := open(t, Config{MemBytes: 1 << 20, Dir: t.TempDir(), DiskBytes: 64 << 20, SegmentSize: 4 << 20, MaxValue: 256 << 10, Policy: policy})
			put := func(from, to int) {
				for i := from; i < to; i++ {
					k := fmt.Sprint("k", i)
					if _, err := s.Put([]byte(k), val(k, 32<<10), false); err != nil {
						t.Fatal(err)
					}
				}
			}
			put(0, 100) // 3.2 MB into 1 MiB of DRAM: the first ones are on disk
			if tier, _ := s.Exists([]byte("k0")); tier != TierDisk {
				t.Fatalf("k0 in %v; want disk", tier)
			}
			s.Exists([]byte("k0"))
			if tier, _ := s.Exists([]byte("k0")); tier != TierDisk {
				t.Fatal("Exists promoted a block")
			}
			before := s.Stats()
			if !s.Prefetch([]byte("k0")) {
				t.Fatal("prefetch of a disk block did not bring it to DRAM")
			}
			after := s.Stats()
			if after.MemHits != before.MemHits || after.DiskHits != before.DiskHits || after.Promotions != before.Promotions+1 {
				t.Fatalf("prefetch counted as a read or not as a promotion: %+v → %+v", before, after)
			}
			if tier, _ := s.Exists([]byte("k0")); tier != TierDRAM {
				t.Fatalf("k0 in %v after prefetch", tier)
			}
			if err := s.checkInvariants(); err != nil {
				t.Fatal(err)
			}
			got, tier, err := get(s, "k0")
			if err != nil || tier != TierDRAM || !bytes.Equal(got, val("k0", 32<<10)) {
				t.Fatalf("read after prefetch: tier %v err %v", tier, err)
			}
			if s.Prefetch([]byte("nope")) {
				t.Fatal("prefetch of a missing key")
			}
			// Not pinned: a DRAM's worth of new blocks pushes an unread
			// prefetched block out again.
			if !s.Prefetch([]byte("k1")) {
				t.Fatal("prefetch k1")
			}
			put(100, 200)
			if tier, _ := s.Exists([]byte("k1")); tier != TierDisk {
				t.Fatalf("prefetched, unread k1 in %v after a DRAM's worth of puts; want disk (evictable)", tier)
			}
			if err := s.checkInvariants(); err != nil {
				t.Fatal(err)
			}
		})
	}
}
