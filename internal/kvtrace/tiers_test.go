package kvtrace

import "testing"

// Hand-computed, DRAM 1 block, disk 2:
//
//	[1 2]  miss miss                    DRAM 2   disk 2 1   hits 0
//	[1 3]  disk hit, miss               DRAM 3   disk 3 1   hits 1 (DRAM 0)
//	[1 2]  disk hit, miss               DRAM 2   disk 2 1   hits 1 (DRAM 0)
//	[3]    miss                                             hits 0
//
// Overall hits equal LRU with the disk's capacity (2 of 7).
func TestTwoTierLRUHandComputed(t *testing.T) {
	rs := reqs([]int64{1, 2}, []int64{1, 3}, []int64{1, 2}, []int64{3})
	r := TwoTierLRU(rs, 1, 2)
	if r.Blocks != 7 || r.PrefixHit != 2 || r.DRAMHit != 0 {
		t.Fatalf("got %+v, want 2 of 7, none from DRAM", r)
	}
	if l := LRU(rs, 2); l.PrefixHit != r.PrefixHit {
		t.Fatalf("two tiers hit %d, LRU of the disk's size %d", r.PrefixHit, l.PrefixHit)
	}
	// [1] [1] [2] [1]: the second [1] is a DRAM hit, the last a disk hit.
	rs = reqs([]int64{1}, []int64{1}, []int64{2}, []int64{1})
	r = TwoTierLRU(rs, 1, 2)
	if r.PrefixHit != 2 || r.DRAMHit != 1 || r.DRAMShare() != 0.5 {
		t.Fatalf("got %+v, want 2 hits, 1 from DRAM", r)
	}
	if inf := Infinite(rs); inf.PrefixHit != 2 {
		t.Fatalf("infinite cache: %d hits, want 2", inf.PrefixHit)
	}
}

// Against the references on a synthetic trace: a disk as large as the trace
// reaches the infinite-cache bound, and the DRAM tier's hits are exactly an
// LRU of the DRAM's size (an inclusive hierarchy).
func TestTwoTierLRUBounds(t *testing.T) {
	rs := ciTrace()
	d := Distinct(rs)
	inf := Infinite(rs)
	for _, f := range []float64{0.1, 0.25} {
		c := int(float64(d) * f)
		r := TwoTierLRU(rs, c, d)
		if r.PrefixHit != inf.PrefixHit {
			t.Errorf("%.0f%%: two tiers with a full disk hit %d, the infinite cache %d", f*100, r.PrefixHit, inf.PrefixHit)
		}
		if l := LRU(rs, c); r.DRAMHit < l.PrefixHit {
			t.Errorf("%.0f%%: DRAM hits %d below a DRAM-only LRU's prefix hits %d", f*100, r.DRAMHit, l.PrefixHit)
		}
		if r.DRAMShare() <= 0 || r.DRAMShare() >= 1 {
			t.Errorf("%.0f%%: DRAM share %.3f", f*100, r.DRAMShare())
		}
	}
}
