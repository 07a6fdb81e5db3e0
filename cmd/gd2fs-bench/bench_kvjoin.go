package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gd2fs/gd2fs/internal/cluster"
	"github.com/spf13/cobra"
)

// newBenchKVJoin measures issue 23's targets: the cached-prefix ratio and
// read p99 of a steady replay of chains before, right after and while a
// 4th server joins 3 (or 1 of 4 is drained).
func newBenchKVJoin() *cobra.Command {
	var chains, blocks, readers int
	var blockSize string
	var before, settle time.Duration
	var drain bool
	cmd := &cobra.Command{
		Use:   "kv-join",
		Short: "Cached-prefix ratio and read p99 of KV chains while a server joins (or is drained)",
		Example: `  gd2fs-bench kv-join                             # 3 servers, 200 chains of 20 blocks, a 4th joins
  gd2fs-bench kv-join --drain                     # 4 servers, one drained
  gd2fs-bench kv-join --chains 2000 --block-size 64KiB --before 10s`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			bs, err := parseSize(blockSize)
			if err != nil {
				return err
			}
			dir, err := os.MkdirTemp("", "gd2fs-kvjoin-")
			if err != nil {
				return err
			}
			defer os.RemoveAll(dir)
			ctx := context.Background()
			n := 3
			if drain {
				n = 4
			}
			need := int64(chains*blocks) * bs
			c, err := cluster.Start(ctx, cluster.Config{Dir: dir, Servers: n, MemBytes: 8 << 20, KVMemBytes: need + need/2 + 64<<20, DownAfter: 2 * time.Second})
			if err != nil {
				return err
			}
			defer c.Close()
			cl := c.Client()
			defer cl.Close()
			kv := cl.KV("perf")
			keys := make([][]string, chains)
			for i := range keys {
				vals := make([][]byte, blocks)
				for j := 0; j < blocks; j++ {
					keys[i] = append(keys[i], fmt.Sprintf("bench/%d/%d", i, j))
					vals[j] = make([]byte, bs)
					vals[j][0] = byte(i + j)
				}
				if err := kv.BatchPut(ctx, keys[i], vals); err != nil {
					return err
				}
			}
			w := &joinWindow{}
			stop := make(chan struct{})
			var wg sync.WaitGroup
			for r := 0; r < readers; r++ {
				wg.Add(1)
				go func() {
					defer wg.Done()
					rng := rand.New(rand.NewPCG(uint64(r), 7))
					for {
						select {
						case <-stop:
							return
						default:
						}
						ch := keys[rng.IntN(len(keys))]
						start := time.Now()
						_, p, err := kv.BatchExists(ctx, ch)
						if err == nil && p > 0 {
							_, err = kv.BatchGet(ctx, ch[:p])
						}
						w.add(p, len(ch), time.Since(start), err)
					}
				}()
			}
			out := cmd.OutOrStdout()
			time.Sleep(before)
			base := w.take()
			fmt.Fprintf(out, "before:            prefix ratio %.4f  p99 %v  (%d requests)\n", base.ratio(), base.p99(), base.n)
			changeAt := time.Now()
			if drain {
				if _, err := cl.DrainServer(ctx, c.Servers[1].ID(), false); err != nil {
					return err
				}
			} else {
				if _, err := c.AddServer(n); err != nil {
					return err
				}
			}
			time.Sleep(time.Second)
			first := w.take()
			fmt.Fprintf(out, "first second after: prefix ratio %.4f (%.3fx before)  p99 %v (%.2fx)\n", first.ratio(), first.ratio()/base.ratio(), first.p99(), float64(first.p99())/float64(base.p99()))
			worst := first.p99()
			for time.Since(changeAt) < settle {
				time.Sleep(time.Second)
				s := w.take()
				worst = max(worst, s.p99())
				fmt.Fprintf(out, "t+%-4.0fs           prefix ratio %.4f (%.3fx)  p99 %v  errors %d\n", time.Since(changeAt).Seconds(), s.ratio(), s.ratio()/base.ratio(), s.p99(), s.errs)
				if s.ratio() >= 0.99*base.ratio() {
					break
				}
			}
			if drain {
				// The drain's target: once the drained server holds nothing,
				// the blocks it held are found on their new owners.
				dctx, cancel := context.WithTimeout(ctx, settle)
				err := cl.WaitDrained(dctx, c.Servers[1].ID(), 100*time.Millisecond, nil)
				cancel()
				if err != nil {
					fmt.Fprintf(out, "drain not finished within --settle %v: %v\n", settle, err)
				} else {
					w.take()
					time.Sleep(time.Second)
					s := w.take()
					fmt.Fprintf(out, "drain done at t+%.0fs: prefix ratio %.4f (%.3fx before)  p99 %v  errors %d\n", time.Since(changeAt).Seconds(), s.ratio(), s.ratio()/base.ratio(), s.p99(), s.errs)
				}
			}
			close(stop)
			wg.Wait()
			var moved, fb, lost int64
			for _, s := range c.Servers {
				mv := s.KVMoves()
				moved, fb, lost = moved+mv.Moved, fb+mv.FallbackHits, lost+mv.Lost
			}
			fmt.Fprintf(out, "worst p99 during the move %v (%.2fx before); blocks moved %d, fallback hits %d, lost %d\n", worst, float64(worst)/float64(base.p99()), moved, fb, lost)
			if drain {
				keysLeft := c.Servers[1].KV().Stats().Keys
				fmt.Fprintf(out, "drained server still holds %d blocks\n", keysLeft)
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.IntVar(&chains, "chains", 200, "chains of blocks")
	f.IntVar(&blocks, "blocks", 20, "blocks per chain")
	f.StringVar(&blockSize, "block-size", "16KiB", "bytes per block")
	f.IntVar(&readers, "readers", 8, "concurrent readers (each: BatchExists of a chain, BatchGet of its cached prefix)")
	f.DurationVar(&before, "before", 5*time.Second, "steady replay before the change")
	f.DurationVar(&settle, "settle", 60*time.Second, "longest wait for the ratio to come back after the change")
	f.BoolVar(&drain, "drain", false, "drain 1 of 4 servers instead of adding a 4th to 3")
	return cmd
}

// joinWindow collects the requests of one measuring window.
type joinWindow struct {
	mu         sync.Mutex
	hit, total int64
	lat        []time.Duration
	n          int64
	errs       atomic.Int64
}

type joinStats struct {
	hit, total, n, errs int64
	lat                 []time.Duration
}

func (w *joinWindow) add(prefix, length int, d time.Duration, err error) {
	if err != nil {
		w.errs.Add(1)
	}
	w.mu.Lock()
	w.hit += int64(prefix)
	w.total += int64(length)
	w.lat = append(w.lat, d)
	w.n++
	w.mu.Unlock()
}

func (w *joinWindow) take() joinStats {
	w.mu.Lock()
	defer w.mu.Unlock()
	s := joinStats{hit: w.hit, total: w.total, n: w.n, lat: w.lat, errs: w.errs.Swap(0)}
	w.hit, w.total, w.n, w.lat = 0, 0, 0, nil
	return s
}

func (s joinStats) ratio() float64 {
	if s.total == 0 {
		return 0
	}
	return float64(s.hit) / float64(s.total)
}

func (s joinStats) p99() time.Duration {
	if len(s.lat) == 0 {
		return 0
	}
	l := slices.Clone(s.lat)
	slices.Sort(l)
	return l[len(l)*99/100]
}
