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
		if got := r.next(l.now); !slices.Equal(got, l.ask) {
			t.Fatalf("look %d over %v: asked %v, want %v", i+1, l.now, got, l.ask)
		}
	}
}
