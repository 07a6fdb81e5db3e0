package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"time"

	"github.com/gd2fs/gd2fs/internal/cluster"
	"github.com/gd2fs/gd2fs/internal/kvstore"
	"github.com/gd2fs/gd2fs/internal/kvtrace"
)

// tierRun is one replay through a server with a DRAM and a disk tier.
type tierRun struct {
	traceRun
	memHits, diskHits uint64          // the server's gets served per tier
	getLat            []time.Duration // one BatchGetInto of a request's leading run each
}

func (r tierRun) dramShare() float64 {
	return float64(r.memHits) / float64(max(1, r.memHits+r.diskHits))
}

func (r tierRun) q(p float64) time.Duration {
	if len(r.getLat) == 0 {
		return 0
	}
	l := slices.Clone(r.getLat)
	slices.Sort(l)
	return l[min(len(l)-1, int(p*float64(len(l))))]
}

// reportTiers replays reqs through a server with a KV DRAM tier of each
// fraction of the distinct blocks and a KV disk tier of diskFrac of their
// bytes, once per policy, beside an exact two-tier LRU and the infinite-cache
// bound computed in the same run (issue 23 item 5: the policy question as a
// user runs the tiers).
func reportTiers(ctx context.Context, out io.Writer, dir string, reqs []kvtrace.Request, fs []float64, diskFrac float64, blockBytes int, policies []string) error {
	d := kvtrace.Distinct(reqs)
	inf := kvtrace.Infinite(reqs)
	pages := int64((blockBytes + kvstore.PageSize - 1) / kvstore.PageSize)
	disk := int64(diskFrac * float64(d) * float64(blockBytes))
	fmt.Fprintf(out, "infinite cache (every block seen before is a hit): %.4f; KV disk tier %.0f%% of the distinct blocks' bytes (%d MiB)\n",
		inf.Ratio(), diskFrac*100, disk>>20)
	fmt.Fprintf(out, "%-7s %6s %8s %8s %7s %10s %10s %10s %10s %10s %9s\n", "policy", "DRAM", "hits", "/inf", "DRAM%", "LRU2 hits", "LRU2 DRAM%", "GET p50", "GET p99", "requests/s", "MiB/s")
	for i, f := range fs {
		c := int(float64(d) * f)
		ref := kvtrace.TwoTierLRU(reqs, c, int(diskFrac*float64(d)))
		mem := int64(max(c, 2)) * pages * kvstore.PageSize
		for _, p := range policies {
			r, err := replayTiers(ctx, fmt.Sprintf("%s/tiers-%d-%s", dir, i, p), reqs, mem, disk, blockBytes, p)
			if err != nil {
				return err
			}
			fmt.Fprintf(out, "%-7s %5.1f%% %8.4f %7.3fx %7.3f %10.4f %10.3f %10s %10s %10.0f %9.1f\n", p, f*100,
				r.ratio(), r.ratio()/inf.Ratio(), r.dramShare(), ref.Ratio(), ref.DRAMShare(), dur(r.q(0.5)), dur(r.q(0.99)),
				float64(len(reqs))/r.elapsed.Seconds(), float64(r.moved)/(1<<20)/r.elapsed.Seconds())
		}
	}
	return nil
}

// replayTiers starts a one-server cluster in this process (the same server
// as `gd2fs up --kv-mem mem --kv-disk disk`, over loopback sockets) and
// replays reqs as replayOverWire does, timing each get and reading the
// server's per-tier hit counters at the end.
func replayTiers(ctx context.Context, dir string, reqs []kvtrace.Request, mem, disk int64, blockBytes int, policy string) (tierRun, error) {
	var res tierRun
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return res, err
	}
	defer os.RemoveAll(dir)
	c, err := cluster.Start(ctx, cluster.Config{Dir: dir, Servers: 1, MemBytes: 8 << 20, KVMemBytes: mem, KVDiskBytes: disk, KVPolicy: policy})
	if err != nil {
		return res, err
	}
	defer c.Close()
	cl := c.Client()
	defer cl.Close()
	kv := cl.KV("perf")
	val := make([]byte, blockBytes)
	var keys []string
	var dsts, vals [][]byte
	start := time.Now()
	for n, q := range reqs {
		keys = keys[:0]
		for _, h := range q.HashIDs {
			keys = append(keys, strconv.FormatInt(h, 36))
		}
		_, run, err := kv.BatchExists(ctx, keys)
		if err != nil {
			return res, fmt.Errorf("request %d: exists: %w", n, err)
		}
		hits := 0
		if run > 0 {
			for len(dsts) < run {
				dsts = append(dsts, make([]byte, blockBytes))
			}
			t0 := time.Now()
			ns, err := kv.BatchGetInto(ctx, keys[:run], dsts[:run])
			if err != nil {
				return res, fmt.Errorf("request %d: get: %w", n, err)
			}
			res.getLat = append(res.getLat, time.Since(t0))
			for _, m := range ns {
				if m < 0 {
					break // evicted between the check and the get: the run ends here
				}
				hits++
			}
		}
		if rest := keys[hits:]; len(rest) > 0 {
			vals = vals[:0]
			for range rest {
				vals = append(vals, val)
			}
			if err := kv.BatchPut(ctx, rest, vals); err != nil {
				return res, fmt.Errorf("request %d: put: %w", n, err)
			}
		}
		res.blocks += int64(len(keys))
		res.hits += int64(hits)
		res.moved += int64(len(keys)) * int64(blockBytes)
	}
	res.elapsed = time.Since(start)
	st := c.Servers[0].KV().Stats()
	res.memHits, res.diskHits = st.MemHits, st.DiskHits
	return res, nil
}
