package main

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"strings"
	"time"

	"github.com/gd2fs/gd2fs/client"
	"github.com/gd2fs/gd2fs/internal/cluster"
	"github.com/spf13/cobra"
)

// newBenchPlanWarm measures issue 23 item 3 for explicit mode: the share of
// plans' loads served from the chunk store's DRAM tier with and without the
// master warming each plan's stored ranges, on sessions whose stored KV is
// several times the DRAM tier.
func newBenchPlanWarm() *cobra.Command {
	var sessions, turns int
	var dram string
	var ratio float64
	var gap time.Duration
	cmd := &cobra.Command{
		Use:   "plan-warm",
		Short: "DRAM share of explicit-mode loads with and without plans warming their stored ranges",
		Long: `Runs a one-server cluster in this process (a DRAM tier of --dram for file chunks and a disk tier)
and sessions whose stored KV is --working-set times the DRAM tier. Each turn picks a session at
random, asks for a plan (16 more tokens), waits --gap (the engine scheduling the request), loads the
stored range (bytes checked), writes the 16 fresh tokens and commits. A load is a DRAM load when
the server brought no chunk in from disk for it. The same turns run twice on fresh clusters: with
the master's plan warming off, then on.`,
		Example: `  gd2fs-bench plan-warm                           # 32 MiB DRAM, 96 MiB of sessions, 300 turns
  gd2fs-bench plan-warm --dram 64MiB --turns 1000 --gap 5ms`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			mem, err := parseSize(dram)
			if err != nil {
				return err
			}
			if mem < 4<<20 || ratio <= 0 || turns <= 0 {
				return fmt.Errorf("--dram must be at least 4MiB, --working-set and --turns positive")
			}
			if sessions == 0 {
				sessions = max(1, int(float64(mem)*ratio)/(4<<20)) // 4 MiB of KV each
			}
			out := cmd.OutOrStdout()
			fmt.Fprintf(out, "DRAM %s, %d sessions of 4 MiB stored KV (%.1fx DRAM), %d turns, gap %v\n", dram, sessions, float64(sessions*4<<20)/float64(mem), turns, gap)
			var shares [2]float64
			for i, on := range []bool{false, true} {
				r, err := planWarmRun(mem, sessions, turns, gap, on)
				if err != nil {
					return err
				}
				shares[i] = float64(r.dram) / float64(max(1, r.loads))
				fmt.Fprintf(out, "warm %-5v  loads %5d  from DRAM %5d  DRAM share %.3f  load p50 %v p99 %v  plans not warmed (busy) %d\n",
					on, r.loads, r.dram, shares[i], r.q(.5), r.q(.99), r.skipped)
			}
			fmt.Fprintf(out, "ratio: DRAM share with warming %.2fx without\n", shares[1]/max(shares[0], 1e-9))
			if up, err := exec.Command("uptime").Output(); err == nil {
				fmt.Fprintf(out, "load: %s\n", strings.TrimSpace(string(up)))
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&dram, "dram", "32MiB", "DRAM tier of file chunks")
	f.Float64Var(&ratio, "working-set", 3, "stored KV of all sessions over the DRAM tier")
	f.IntVar(&sessions, "sessions", 0, "sessions (default: from --working-set)")
	f.IntVar(&turns, "turns", 300, "turns per run")
	f.DurationVar(&gap, "gap", 2*time.Millisecond, "time between a plan and its load")
	return cmd
}

type planWarmResult struct {
	prefetchStats
	loads, dram, skipped uint64
}

func planWarmRun(mem int64, sessions, turns int, gap time.Duration, warm bool) (planWarmResult, error) {
	var res planWarmResult
	dir, err := os.MkdirTemp("", "gd2fs-planwarm-")
	if err != nil {
		return res, err
	}
	defer os.RemoveAll(dir)
	ctx := context.Background()
	c, err := cluster.Start(ctx, cluster.Config{Dir: dir, Servers: 1, MemBytes: mem, DiskBytes: 64*mem + 1<<30})
	if err != nil {
		return res, err
	}
	defer c.Close()
	c.Master.SetPlanWarm(warm)
	cl := c.Client()
	defer cl.Close()
	ss := cl.Sessions()
	// 8 KiB of KV per token: 512 tokens are 4 MiB.
	l := client.Layout{Model: "warm", Layers: 4, KVHeads: 4, HeadDim: 128, DType: "fp16", PageTokens: 16, Order: "page_first"}
	if err := ss.SetLayout(ctx, l); err != nil {
		return res, err
	}
	tokens := make([]int, sessions)
	kv := func(s, n int) []byte { return bytes.Repeat([]byte{byte(s)}, int(l.RangeBytes(int64(n)))) }
	ids := func(s, n int) []uint32 {
		out := make([]uint32, n)
		for i := range out {
			out[i] = uint32(s<<20 + i)
		}
		return out
	}
	turn := func(s, n int, load bool) error {
		p, err := ss.Plan(ctx, fmt.Sprintf("s%d", s), client.PlanRequest{Model: l.Model, TokenIDs: ids(s, n)})
		if err != nil {
			return err
		}
		if load && p.LoadBytes > 0 {
			time.Sleep(gap) // the engine schedules the request, then loads
			before := c.Servers[0].Store().Stats().ReadPromotions
			buf := make([]byte, p.LoadBytes)
			start := time.Now()
			if _, err := ss.LoadStored(ctx, p, buf); err != nil {
				return err
			}
			res.lat = append(res.lat, time.Since(start))
			if !bytes.Equal(buf, kv(s, int(p.CachedTokens))) {
				return fmt.Errorf("session %d: stored range reads other bytes", s)
			}
			res.loads++
			if c.Servers[0].Store().Stats().ReadPromotions == before {
				res.dram++
			}
		}
		if err := ss.WriteFresh(ctx, p, kv(s, n)[l.RangeBytes(p.CachedTokens):]); err != nil {
			return err
		}
		_, err = ss.Commit(ctx, fmt.Sprintf("s%d", s), p.PlanID)
		return err
	}
	for s := range tokens {
		tokens[s] = 512
		if err := turn(s, tokens[s], false); err != nil {
			return res, err
		}
	}
	rng := rand.New(rand.NewPCG(23, 5))
	for range turns {
		s := rng.IntN(sessions)
		tokens[s] += 16
		if err := turn(s, tokens[s], true); err != nil {
			return res, err
		}
	}
	_, res.skipped = c.Master.WaitPlanWarm()
	return res, nil
}
