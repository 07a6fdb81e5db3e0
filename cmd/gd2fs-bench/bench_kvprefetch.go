package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/gd2fs/gd2fs/client"
	"github.com/gd2fs/gd2fs/internal/cluster"
	"github.com/spf13/cobra"
)

// newBenchKVPrefetch measures issue 23 item 3's target: the DRAM share of
// KV reads with and without prefetch, on requests over chains whose blocks
// are three times the servers' DRAM tiers. Each request asks which of its
// chain's blocks are cached (BatchExistsWith, Prefetch on or off), waits
// --gap (the engine scheduling it), then reads the cached prefix. Both runs
// use a fresh cluster of the same size and the same request sequence.
func newBenchKVPrefetch() *cobra.Command {
	var servers, chainLen, requests, clients int
	var blockSize, dram, policy string
	var ratio float64
	var gap time.Duration
	cmd := &cobra.Command{
		Use:   "kv-prefetch",
		Short: "DRAM share of KV reads with and without prefetch, on a working set 3x the DRAM tier",
		Example: `  gd2fs-bench kv-prefetch                         # 1 server, 32 MiB DRAM, 96 MiB of chains
  gd2fs-bench kv-prefetch --servers 3 --dram 64MiB --requests 4000 --gap 2ms`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			bs, err := parseSize(blockSize)
			if err != nil {
				return err
			}
			mem, err := parseSize(dram)
			if err != nil {
				return err
			}
			if bs <= 0 || mem <= 0 || chainLen <= 0 || ratio <= 0 {
				return fmt.Errorf("--block-size, --dram, --chain and --working-set must be positive")
			}
			chains := int(float64(mem*int64(servers))*ratio) / int(bs) / chainLen
			out := cmd.OutOrStdout()
			fmt.Fprintf(out, "%d servers, DRAM %s each (policy %s), %d chains of %d blocks of %s (%.1fx the DRAM tiers), %d requests by %d clients, gap %v\n",
				servers, dram, policy, chains, chainLen, blockSize, ratio, requests, clients, gap)
			var shares [2]float64
			for i, pf := range []bool{false, true} {
				st, err := prefetchRun(servers, mem, bs, chains, chainLen, requests, clients, gap, pf, policy)
				if err != nil {
					return err
				}
				shares[i] = st.share()
				fmt.Fprintf(out, "prefetch %-5v  DRAM hits %6d  disk hits %6d  DRAM share of reads %.3f  read p50 %v p99 %v\n",
					pf, st.mem, st.disk, st.share(), st.q(.5), st.q(.99))
			}
			fmt.Fprintf(out, "ratio: DRAM share with prefetch %.2fx without (target >= 1.5x)\n", shares[1]/shares[0])
			if up, err := exec.Command("uptime").Output(); err == nil {
				fmt.Fprintf(out, "load: %s", strings.TrimSpace(string(up))+"\n")
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.IntVar(&servers, "servers", 1, "data servers")
	f.StringVar(&dram, "dram", "32MiB", "KV DRAM tier per server")
	f.StringVar(&blockSize, "block-size", "64KiB", "KV block size")
	f.IntVar(&chainLen, "chain", 16, "blocks per request's chain")
	f.Float64Var(&ratio, "working-set", 3, "bytes of chains over the DRAM tiers' bytes")
	f.IntVar(&requests, "requests", 2000, "requests per run")
	f.IntVar(&clients, "clients", 4, "requests in flight")
	f.StringVar(&policy, "policy", "auto", "the servers' --kv-policy: auto, s3fifo or lru")
	f.DurationVar(&gap, "gap", 2*time.Millisecond, "time between a request's exists probe and its reads")
	return cmd
}

type prefetchStats struct {
	mem, disk uint64
	lat       []time.Duration
}

func (s prefetchStats) share() float64 { return float64(s.mem) / float64(max(1, s.mem+s.disk)) }

func (s prefetchStats) q(p float64) time.Duration {
	if len(s.lat) == 0 {
		return 0
	}
	l := append([]time.Duration(nil), s.lat...)
	slices.Sort(l)
	return l[min(len(l)-1, int(p*float64(len(l))))]
}

func prefetchRun(servers int, mem, bs int64, chains, chainLen, requests, clients int, gap time.Duration, prefetch bool, policy string) (prefetchStats, error) {
	var st prefetchStats
	dir, err := os.MkdirTemp("", "gd2fs-kvprefetch-")
	if err != nil {
		return st, err
	}
	defer os.RemoveAll(dir)
	ctx := context.Background()
	disk := max(256<<20, 8*mem)
	c, err := cluster.Start(ctx, cluster.Config{Dir: dir, Servers: servers, MemBytes: 8 << 20, KVMemBytes: mem, KVDiskBytes: disk, KVPolicy: policy})
	if err != nil {
		return st, err
	}
	defer c.Close()
	cl := c.Client()
	defer cl.Close()
	kv := cl.KV("perf")
	keys := make([][]string, chains)
	val := make([]byte, bs)
	for i := range keys {
		vals := make([][]byte, chainLen)
		for j := range vals {
			keys[i] = append(keys[i], fmt.Sprintf("pf/%d/%d", i, j))
			vals[j] = val
		}
		if err := kv.BatchPut(ctx, keys[i], vals); err != nil {
			return st, err
		}
	}
	base := serverHits(c)
	var mu sync.Mutex
	var wg sync.WaitGroup
	next := make(chan int)
	for w := 0; w < clients; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			buf := make([][]byte, chainLen)
			for i := range buf {
				buf[i] = make([]byte, bs)
			}
			for r := range next {
				ch := keys[r]
				_, p, err := kv.BatchExistsWith(ctx, ch, client.ExistsOptions{Prefetch: prefetch})
				if err != nil {
					continue
				}
				time.Sleep(gap) // the engine schedules the request, then runs it
				start := time.Now()
				if _, err := kv.BatchGetInto(ctx, ch[:p], buf[:p]); err != nil {
					continue
				}
				mu.Lock()
				st.lat = append(st.lat, time.Since(start))
				mu.Unlock()
			}
		}()
	}
	rng := rand.New(rand.NewPCG(23, 3))
	for i := 0; i < requests; i++ {
		next <- rng.IntN(chains)
	}
	close(next)
	wg.Wait()
	end := serverHits(c)
	st.mem, st.disk = end[0]-base[0], end[1]-base[1]
	return st, nil
}

// serverHits sums the servers' DRAM and disk hits.
func serverHits(c *cluster.Cluster) [2]uint64 {
	var h [2]uint64
	for _, s := range c.Servers {
		st := s.KV().Stats()
		h[0] += st.MemHits
		h[1] += st.DiskHits
	}
	return h
}
