package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gd2fs/gd2fs/client"
	"github.com/gd2fs/gd2fs/internal/bench"
	"github.com/gd2fs/gd2fs/internal/cluster"
	"github.com/gd2fs/gd2fs/internal/meta"
	"github.com/spf13/cobra"
)

func newBenchPlan() *cobra.Command {
	var metaDSN string
	var sessions, plans, conc int
	cmd := &cobra.Command{
		Use:   "plan",
		Short: "Plan latency and plans per second with many sessions, against SQLite or PostgreSQL",
		Example: `  gd2fs-bench plan                                           # 100,000 sessions in a temp SQLite file
  gd2fs-bench plan --meta postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx := context.Background()
			if metaDSN == "" {
				dir, err := os.MkdirTemp("", "gd2fs-benchplan-")
				if err != nil {
					return err
				}
				defer os.RemoveAll(dir)
				metaDSN = "sqlite://" + filepath.Join(dir, "meta.db")
			}
			ms, err := meta.Open(ctx, metaDSN)
			if err != nil {
				return err
			}
			defer ms.Close()
			// Plan as a master does: as the leader, from the session table
			// in its memory (internal/meta/cache.go).
			if ok, err := ms.Lead(ctx, "http://gd2fs-bench"); err != nil || !ok {
				return fmt.Errorf("the benchmark's store does not lead (another master uses %s?): %v", metaDSN, err)
			}
			l := meta.Layout{Model: "bench-llama", Layers: 32, KVHeads: 8, HeadDim: 128, DType: "bf16", PageTokens: 16, Order: "layer_first"}
			if err := ms.PutLayout(ctx, l); err != nil {
				return err
			}
			run := fmt.Sprintf("b%d-", time.Now().UnixNano())
			// Every session's conversation is the same run of token ids: a
			// plan sends the ids of its prompt (the master hashes them, as it
			// does for a router's plans).
			conv := tokenIDs(0, 1500)
			in := func(id string, prompt int64) meta.PlanInput {
				return meta.PlanInput{Session: id, Model: l.Model, TokenIDs: conv[:prompt], Dir: "/kv-bench", Pool: "perf",
					ChunkSize: 16 << 20, PlanTTL: time.Hour, Now: time.Now()}
			}
			// Set-up: every session gets one committed turn of 1000 tokens.
			start := time.Now()
			err = parallel(conc, sessions, func(i int) error {
				id := fmt.Sprintf("%s%07d", run, i)
				p, err := ms.PlanSession(ctx, in(id, 1000))
				if err == nil {
					var f meta.File
					if f, err = ms.File(ctx, p.Fresh[0].Path); err == nil {
						if _, err = ms.Commit(ctx, f.ID, p.Fresh[0].KVStart+p.Fresh[0].KVLength, nil, false, time.Now()); err == nil {
							_, err = ms.CommitSession(ctx, meta.CommitInput{Session: id, PlanID: p.ID, Now: time.Now()})
						}
					}
				}
				if err != nil {
					return err
				}
				if i%20000 == 19999 {
					fmt.Fprintf(os.Stderr, "  %d sessions created (%.0f/s)\n", i+1, float64(i+1)/time.Since(start).Seconds())
				}
				return nil
			})
			if err != nil {
				return err
			}
			errc := make(chan error, conc)
			fmt.Printf("bench plan: %s, %d sessions created in %s\n", engineName(metaDSN), sessions, time.Since(start).Round(time.Millisecond))
			for _, c := range []int{1, conc} {
				lat := make([]time.Duration, plans)
				var next atomic.Int64
				t0 := time.Now()
				var wg sync.WaitGroup
				for w := 0; w < c; w++ {
					wg.Add(1)
					go func(w int) {
						defer wg.Done()
						r := rand.New(rand.NewPCG(uint64(w), 3))
						for {
							i := next.Add(1) - 1
							if i >= int64(plans) {
								return
							}
							id := fmt.Sprintf("%s%07d", run, r.IntN(sessions))
							t := time.Now()
							if _, err := ms.PlanSession(ctx, in(id, 1000+int64(r.IntN(500)))); err != nil {
								errc <- err
								return
							}
							lat[i] = time.Since(t)
						}
					}(w)
				}
				wg.Wait()
				el := time.Since(t0)
				select {
				case err := <-errc:
					return err
				default:
				}
				sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
				fmt.Printf("  %2d planners: %6.0f plans/s, p50 %s, p99 %s (%d plans)\n", c, float64(plans)/el.Seconds(), dur(lat[plans/2]), dur(lat[plans*99/100]), plans)
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&metaDSN, "meta", "", "metadata store (default: a temp SQLite file)")
	f.IntVar(&sessions, "sessions", 100000, "sessions to create first")
	f.IntVar(&plans, "plans", 5000, "plans to time")
	f.IntVar(&conc, "concurrency", 8, "concurrent planners for set-up and the second measurement")
	return cmd
}

func newBenchSessionLoad() *cobra.Command {
	var tokens, turn int64
	var runs int
	cmd := &cobra.Command{
		Use:   "session-load",
		Short: "Load a long context through a plan (its stored ranges) beside reading the same bytes as one file",
		Example: `  gd2fs-bench session-load                 # 32k tokens of Llama-3-8B KV per TP rank (16 KiB/token, 512 MiB)
  gd2fs-bench session-load --tokens 8192`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx := context.Background()
			dir, err := os.MkdirTemp("", "gd2fs-benchload-")
			if err != nil {
				return err
			}
			defer os.RemoveAll(dir)
			c, err := cluster.Start(ctx, cluster.Config{Dir: dir, MemBytes: 1 << 30, DiskBytes: 4 << 30})
			if err != nil {
				return err
			}
			defer c.Close()
			cl := c.Client()
			defer cl.Close()
			ss := cl.Sessions()
			// Llama-3-8B, tensor parallel 8: one KV head per rank.
			l := client.Layout{Model: "llama-3-8b-tp8", Layers: 32, KVHeads: 1, HeadDim: 128, DType: "bf16", PageTokens: 16, Order: "layer_first"}
			if err := ss.SetLayout(ctx, l); err != nil {
				return err
			}
			var committed int64
			conv := tokenIDs(0, tokens+1)
			for committed < tokens {
				n := min(turn, tokens-committed)
				p, err := ss.Plan(ctx, "long", client.PlanRequest{Model: l.Model, TokenIDs: conv[:committed+n]})
				if err != nil {
					return err
				}
				kv := make([]byte, p.Fresh[0].KVLength)
				for i := range kv {
					kv[i] = byte(i ^ int(committed))
				}
				if err := ss.WriteFresh(ctx, p, kv); err != nil {
					return err
				}
				if _, err := ss.Commit(ctx, "long", p.PlanID); err != nil {
					return err
				}
				committed += n
			}
			// The same bytes as one file.
			total := l.RangeBytes(turn) * (tokens / turn)
			one := make([]byte, total)
			f, err := cl.Create(ctx, "/bench/one", client.CreateOptions{Pool: "perf"})
			if err != nil {
				return err
			}
			if _, err := f.WriteAt(one, 0); err != nil {
				return err
			}
			f.Close()
			var viaPlan, viaFile, planLat []float64
			var p client.Plan
			for r := 0; r < runs; r++ {
				t0 := time.Now()
				p, err = ss.Plan(ctx, "long", client.PlanRequest{Model: l.Model, TokenIDs: conv})
				if err != nil {
					return err
				}
				planLat = append(planLat, time.Since(t0).Seconds())
				buf := one[:p.LoadBytes]
				if _, err := ss.LoadStored(ctx, p, buf); err != nil {
					return err
				}
				viaPlan = append(viaPlan, float64(p.LoadBytes)/time.Since(t0).Seconds())
				g, err := cl.Open(ctx, "/bench/one")
				if err != nil {
					return err
				}
				t1 := time.Now()
				if _, err := g.ReadAt(one, 0); err != nil {
					return err
				}
				viaFile = append(viaFile, float64(total)/time.Since(t1).Seconds())
			}
			fmt.Printf("bench session-load: %d tokens of %s (%d bytes/token) committed in %d turns of %d, %d runs, medians\n",
				tokens, l.Model, l.TokenBytes(), tokens/turn, turn, runs)
			fmt.Printf("  plan: %d stored ranges, %s to load, %d cached tokens, plan latency %s\n", len(p.Stored), human(p.LoadBytes), p.CachedTokens,
				dur(time.Duration(bench.Median(planLat)*1e9)))
			pm, fm := bench.Median(viaPlan), bench.Median(viaFile)
			fmt.Printf("  through the plan (plan + load):  %6.0f MiB/s  (%s)\n", pm/(1<<20), dur(time.Duration(float64(p.LoadBytes)/pm*1e9)))
			fmt.Printf("  the same bytes as one file:      %6.0f MiB/s  (%s)\n", fm/(1<<20), dur(time.Duration(float64(total)/fm*1e9)))
			fmt.Printf("  ratio %.2fx\n", pm/fm)
			return nil
		},
	}
	f := cmd.Flags()
	f.Int64Var(&tokens, "tokens", 32768, "context length")
	f.Int64Var(&turn, "turn", 8192, "tokens committed per turn (each turn is one stored range)")
	f.IntVar(&runs, "runs", 5, "repetitions")
	return cmd
}

func engineName(dsn string) string {
	if strings.HasPrefix(dsn, "sqlite://") {
		return "SQLite"
	}
	return "PostgreSQL"
}

// tokenIDs is n token ids from first on: a benchmark's conversation.
func tokenIDs(first uint32, n int64) []uint32 {
	out := make([]uint32, n)
	for i := range out {
		out[i] = first + uint32(i)
	}
	return out
}
