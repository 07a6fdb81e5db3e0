package meta

import (
	"context"
	"fmt"
	"path/filepath"
	"syscall"
	"testing"
	"time"
)

// BenchmarkTurn is one chat turn in the store, as a router's client makes
// it: a content-checked plan that places its fresh range, then a written
// commit, on one of 1,000 sessions of a SQLite store that leads (so the
// session table in its memory answers, cache.go), in each write-behind
// mode (writebehind.go; sync: none). Its reference, measured in the same
// run, is the same turns on a store that does not lead (every read from
// SQL, as before the cache); the _sql_over_ metrics are the ratios.
func BenchmarkTurn(b *testing.B) {
	for _, mode := range []string{DurabilitySync, DurabilityFlush, DurabilityWindow} {
		b.Run(mode, func(b *testing.B) { benchmarkTurn(b, mode) })
	}
}

func benchmarkTurn(b *testing.B, mode string) {
	b.Setenv("GD2FS_META_INVARIANTS", "0") // they read every session after each transaction
	ctx := context.Background()
	const sessions = 1000
	conv := make([]uint32, 4096)
	for i := range conv {
		conv[i] = uint32(i * 7)
	}
	place := func(fileID, idx int64) ([]string, error) { return []string{"s1"}, nil }
	setup := func(lead bool) func(i int) error {
		s, err := Open(ctx, "sqlite://"+filepath.Join(b.TempDir(), "meta.db"))
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { s.Close() })
		if err := s.(DurabilitySetter).SetSessionDurability(mode); err != nil {
			b.Fatal(err)
		}
		if lead {
			if ok, err := s.Lead(ctx, "http://bench"); !ok || err != nil {
				b.Fatal(ok, err)
			}
		}
		l := Layout{Model: "m", Layers: 4, KVHeads: 2, HeadDim: 64, DType: "bf16", PageTokens: 16, Order: "layer_first"}
		if err := s.PutLayout(ctx, l); err != nil {
			b.Fatal(err)
		}
		tokens := make([]int64, sessions)
		turn := func(i int) error {
			id := fmt.Sprintf("s%05d", i)
			n := tokens[i] + 200
			if n > int64(len(conv)) {
				n = 200
			}
			p, err := s.PlanSession(ctx, PlanInput{Session: id, Model: l.Model, TokenIDs: conv[:n], Dir: "/kv-sessions", Pool: "perf",
				ChunkSize: 16 << 20, PlanTTL: time.Hour, Now: time.Now(), Place: place, RequestID: fmt.Sprintf("r%d-%d", i, n)})
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
		return turn
	}
	ref, turn := setup(false), setup(true)
	// On a shared machine the process's CPU time per turn says more than
	// the wall time (each turn also waits for two fsyncs).
	cpu := func() time.Duration {
		var ru syscall.Rusage
		if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
			b.Fatal(err)
		}
		return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	}
	run := func(turn func(int) error) (wall, used time.Duration) {
		t, c := time.Now(), cpu()
		for i := 0; i < b.N; i++ {
			if err := turn(i % sessions); err != nil {
				b.Fatal(err)
			}
		}
		return time.Since(t), cpu() - c
	}
	b.ResetTimer()
	sqlWall, sqlCPU := run(ref)
	wall, used := run(turn)
	b.StopTimer()
	n := float64(b.N)
	b.ReportMetric(float64(wall.Nanoseconds())/n, "ns/turn")
	b.ReportMetric(float64(used.Nanoseconds())/n, "cpu-ns/turn")
	b.ReportMetric(float64(sqlWall.Nanoseconds())/n, "sql-ns/turn")
	b.ReportMetric(float64(sqlCPU.Nanoseconds())/n, "sql-cpu-ns/turn")
	b.ReportMetric(float64(sqlCPU)/float64(used), "cpu_sql_over_cache")
	b.ReportMetric(float64(sqlWall)/float64(wall), "wall_sql_over_cache")
}
