package main

import (
	"context"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/gd2fs/gd2fs/client"
	"github.com/gd2fs/gd2fs/internal/bench"
	"github.com/gd2fs/gd2fs/internal/cluster"
	"github.com/spf13/cobra"
)

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
