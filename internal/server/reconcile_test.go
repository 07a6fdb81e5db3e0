package server

import (
	"slices"
	"testing"
)

// TestReconcileAsksOncePerChunkAfterAPeriod: a chunk is asked about once,
// at the first look after the look that first saw it (so it has been held
// at least one period), and not at all if it is gone by then; the chunks
// found at start (asked then) are never asked again.
func TestReconcileAsksOncePerChunkAfterAPeriod(t *testing.T) {
	r := reconcile{prev: []uint64{1, 2}} // found at start
	looks := []struct{ now, ask []uint64 }{
		{now: []uint64{1, 2, 5, 7}, ask: nil},         // 5 and 7 arrive
		{now: []uint64{1, 5, 8}, ask: []uint64{5}},    // 7 went before its turn; 8 arrives
		{now: []uint64{1, 5, 8, 9}, ask: []uint64{8}}, // 9 arrives
		{now: []uint64{1, 5, 8, 9}, ask: []uint64{9}}, // each once
		{now: []uint64{1, 5, 8, 9}, ask: nil},         // nothing new
		{now: []uint64{3, 10}, ask: nil},              // 3, 10 arrive (ids in any order)
		{now: []uint64{3, 10}, ask: []uint64{3, 10}},
	}
	for i, l := range looks {
		if got := r.next(l.now, nil); !slices.Equal(got, l.ask) {
			t.Fatalf("look %d over %v: asked %v, want %v", i+1, l.now, got, l.ask)
		}
	}
	// A chunk being copied is asked about at the first look after it
	// stopped being busy, not before.
	busy := true
	r = reconcile{prev: []uint64{1}}
	isBusy := func(id uint64) bool { return id == 4 && busy }
	for i, now := range [][]uint64{{1, 4}, {1, 4}, {1, 4}} {
		if got := r.next(now, isBusy); got != nil {
			t.Fatalf("busy look %d: asked %v, want nothing", i+1, got)
		}
	}
	busy = false
	if got := r.next([]uint64{1, 4}, isBusy); !slices.Equal(got, []uint64{4}) {
		t.Fatalf("after the copy: asked %v, want [4]", got)
	}
}
