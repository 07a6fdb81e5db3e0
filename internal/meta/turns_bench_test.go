package meta

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/gd2fs/gd2fs/kvlayout"
)

// BenchmarkTurn is one chat turn in the store, as a router's client makes
// it: a content-checked plan that places its fresh range, then a written
// commit, on one of 1,000 sessions. Its reference in the same run is a
// namespace round trip of the same store (File of a session file), so the
// ratio says what a turn costs beside the cheapest read.
func BenchmarkTurn(b *testing.B) {
	ctx := context.Background()
	b.Setenv("GD2FS_META_INVARIANTS", "0") // they read every session after each transaction
	s, err := Open(ctx, "sqlite://"+filepath.Join(b.TempDir(), "meta.db"))
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	l := Layout{Model: "m", Layers: 4, KVHeads: 2, HeadDim: 64, DType: "bf16", PageTokens: 16, Order: "layer_first"}
	if err := s.PutLayout(ctx, l); err != nil {
		b.Fatal(err)
	}
	const sessions = 1000
	conv := make([]uint32, 4096)
	for i := range conv {
		conv[i] = uint32(i * 7)
	}
	place := func(fileID, idx int64) ([]string, error) { return []string{"s1"}, nil }
	tokens := make([]int64, sessions)
	turn := func(i int) error {
		id := fmt.Sprintf("s%05d", i)
		n := tokens[i] + 200
		if n > int64(len(conv)) {
			n = 200
		}
		p, err := s.PlanSession(ctx, PlanInput{Session: id, Model: l.Model, TokenIDs: conv[:n], Dir: "/kv-sessions", Pool: "perf",
			ChunkSize: 16 << 20, PlanTTL: time.Hour, Now: time.Now(), Place: place})
		if err != nil {
			return err
		}
		if _, err := s.CommitSession(ctx, CommitInput{Session: id, PlanID: p.ID, Written: true, Now: time.Now()}); err != nil {
			return err
		}
		tokens[i] = n
		return nil
	}
	for i := 0; i < sessions; i++ {
		if err := turn(i); err != nil {
			b.Fatal(err)
		}
	}
	_ = kvlayout.BlockHashes
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if err := turn(i % sessions); err != nil {
			b.Fatal(err)
		}
	}
}
