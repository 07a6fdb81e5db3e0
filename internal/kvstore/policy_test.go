package kvstore

import (
	"fmt"
	"math/rand/v2"
	"testing"
)

// A block demoted from small and put again grows small's target by its
// size; one demoted from main and put again shrinks it; the target stays
// within 10% and 90% of DRAM whatever the traffic.
func TestSmallTargetFollowsGhostHits(t *testing.T) {
	const pages = 100
	s := open(t, Config{MemBytes: pages * PageSize, Policy: "s3fifo"})
	memCap := int64(pages * PageSize)
	v := make([]byte, PageSize)
	if got := s.Stats().SmallTarget; got != memCap/10 {
		t.Fatalf("initial target %d, want %d", got, memCap/10)
	}
	// 150 blocks never read: the first ones leave small as ghosts.
	for i := range 150 {
		if _, err := s.Put([]byte(fmt.Sprint("a", i)), v, false); err != nil {
			t.Fatal(err)
		}
	}
	before := s.Stats().SmallTarget
	if _, err := s.Put([]byte("a0"), v, false); err != nil { // a small ghost comes back
		t.Fatal(err)
	}
	if got := s.Stats().SmallTarget; got != before+PageSize {
		t.Fatalf("after a small-ghost hit: target %d, want %d", got, before+PageSize)
	}
	if tier, _ := s.Exists([]byte("a0")); tier != TierDRAM {
		t.Fatalf("a ghost put again is in %v, want DRAM (main)", tier)
	}

	// Random traffic with reads: the target never leaves its bounds, and
	// main-ghost hits happen and pull it down at least once.
	r := rand.New(rand.NewPCG(1, 2))
	shrunk := false
	for i := range 20000 {
		k := []byte(fmt.Sprint("b", r.IntN(400)))
		if r.IntN(2) == 0 {
			get(s, string(k))
		} else {
			prev := s.Stats().SmallTarget
			if _, err := s.Put(k, v, false); err != nil {
				t.Fatal(err)
			}
			if s.Stats().SmallTarget < prev {
				shrunk = true
			}
		}
		if st := s.Stats(); st.SmallTarget < memCap/10 || st.SmallTarget > memCap*9/10 {
			t.Fatalf("op %d: target %d outside [%d, %d]", i, st.SmallTarget, memCap/10, memCap*9/10)
		}
	}
	if !shrunk {
		t.Error("no main-ghost hit ever shrank the target")
	}
}
