package main

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/gd2fs/gd2fs/client"
	"github.com/gd2fs/gd2fs/internal/kvstore"
	"github.com/gd2fs/gd2fs/internal/kvtrace"
	"github.com/spf13/cobra"
)

// newBenchKVTrace replays a KV-cache request trace against a gd2fs server
// process over the wire, beside an exact LRU and an exact clairvoyant
// (Belady) cache of the same capacity computed in the same run.
func newBenchKVTrace() *cobra.Command {
	var traceFile, gen, fractions, dir, policy string
	var blockBytes int
	var disk float64
	cmd := &cobra.Command{
		Use:   "kv-trace",
		Short: "Prefix-hit ratio of a KV-cache trace replayed against a gd2fs server, beside exact LRU and Belady",
		Long: `Replays a trace of inference requests as a KV connector does: for each request, BatchExists on
its blocks (the prefix check), BatchGetInto of the leading run of hits, BatchPut of the rest. The
server is a 'gd2fs up' process with one server whose KV DRAM tier holds the given fraction of the
trace's distinct blocks, and no disk tier. Prints the prefix-hit ratio (hit blocks of each
request's leading run / all blocks) beside LRU and Belady of the same capacity, and throughput.

Trace input: JSON lines {"timestamp": ms, "input_length": n, "output_length": n, "hash_ids": [...]}
(equal ids = the same block). Without --trace a synthetic multi-turn trace is generated; --gen sets
its parameters: requests, system_prompts, system_blocks, one_off_fraction, mean_turns,
user_blocks, output_blocks, one_off_blocks, mean_think_ms, sessions_per_sec, seed.

With --disk F the server also has a KV disk tier of F times the distinct blocks' bytes (a user's
DRAM + disk setup; --disk 1 holds every block) and runs in this process, once per --policy
(comma-separated: auto,lru replays both). It prints the overall prefix-hit ratio against the
infinite-cache bound (every block seen before is a hit), the share of hits served from DRAM, the
GET p50/p99 of a request's leading run (one BatchGetInto), beside an exact two-tier LRU of the same
sizes (LRU2) computed in the same run.`,
		Example: `  gd2fs-bench kv-trace                                   # synthetic trace, DRAM at 10% and 25%
  gd2fs-bench kv-trace --gen requests=5000,one_off_fraction=0.3 --fractions 0.1
  bash scripts/mooncake-trace.sh /tmp/mc.jsonl && gd2fs-bench kv-trace --trace /tmp/mc.jsonl --fractions 0.05,0.1,0.25
  gd2fs-bench kv-trace --policy lru                      # the server's --kv-policy: auto (default), s3fifo, lru
  gd2fs-bench kv-trace --trace /tmp/mc.jsonl --fractions 0.1 --disk 1 --policy auto,lru   # DRAM 10% + disk 100%`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx := context.Background()
			policies := strings.Split(policy, ",")
			for _, p := range policies {
				if !slices.Contains(kvstore.Policies, p) {
					return fmt.Errorf("--policy %q: want one or more of %s, comma-separated", policy, strings.Join(kvstore.Policies, ", "))
				}
			}
			if len(policies) > 1 && disk == 0 {
				return fmt.Errorf("--policy %q: several policies need --disk (the DRAM-only replay takes one)", policy)
			}
			if disk < 0 || disk > 4 {
				return fmt.Errorf("--disk %v: a fraction of the distinct blocks' bytes between 0 (no disk tier) and 4", disk)
			}
			var reqs []kvtrace.Request
			if traceFile != "" {
				f, err := os.Open(traceFile)
				if err != nil {
					return err
				}
				reqs, err = kvtrace.Read(f)
				f.Close()
				if err != nil {
					return fmt.Errorf("%s: %w", traceFile, err)
				}
			} else {
				c, err := kvtrace.ParseGen(kvtrace.DefaultGen(), gen)
				if err != nil {
					return err
				}
				reqs = kvtrace.Generate(c)
			}
			var fs []float64
			for _, s := range strings.Split(fractions, ",") {
				f, err := strconv.ParseFloat(strings.TrimSpace(s), 64)
				if err != nil || f <= 0 || f > 1 {
					return fmt.Errorf("--fractions %q: comma-separated numbers in (0, 1]", fractions)
				}
				fs = append(fs, f)
			}
			if blockBytes < 1 || blockBytes > 4<<20 {
				return fmt.Errorf("--block-bytes %d: between 1 and 4 MiB", blockBytes)
			}
			if dir == "" {
				var err error
				if dir, err = os.MkdirTemp("", "gd2fs-benchtrace-"); err != nil {
					return err
				}
				defer os.RemoveAll(dir)
			}
			d := kvtrace.Distinct(reqs)
			var blocks int
			for _, q := range reqs {
				blocks += len(q.HashIDs)
			}
			if disk > 0 {
				fmt.Printf("trace: %d requests, %d blocks, %d distinct; blocks of %d bytes; one gd2fs server in this process over loopback\n", len(reqs), blocks, d, blockBytes)
				return reportTiers(ctx, cmd.OutOrStdout(), dir, reqs, fs, disk, blockBytes, policies)
			}
			fmt.Printf("trace: %d requests, %d blocks, %d distinct; blocks of %d bytes; one gd2fs server process over loopback\n", len(reqs), blocks, d, blockBytes)
			fmt.Printf("%8s %9s %8s %8s %8s %9s %12s %10s %10s\n", "DRAM", "blocks", "gd2fs", "LRU", "Belady", "gd2fs/LRU", "gd2fs/Belady", "requests/s", "MiB/s")
			for i, f := range fs {
				c := int(float64(d) * f)
				pages := int64((blockBytes + kvstore.PageSize - 1) / kvstore.PageSize)
				mem := int64(max(c, 2)) * pages * kvstore.PageSize
				res, err := replayOverWire(ctx, fmt.Sprintf("%s/run-%d", dir, i), reqs, mem, blockBytes, policy)
				if err != nil {
					return err
				}
				l, b := kvtrace.LRU(reqs, c), kvtrace.Belady(reqs, c)
				fmt.Printf("%7.1f%% %9d %8.4f %8.4f %8.4f %8.3fx %11.3fx %10.0f %10.1f\n", f*100, c, res.ratio(), l.Ratio(), b.Ratio(),
					res.ratio()/l.Ratio(), res.ratio()/b.Ratio(), float64(len(reqs))/res.elapsed.Seconds(),
					float64(res.moved)/(1<<20)/res.elapsed.Seconds())
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&traceFile, "trace", "", "JSON-lines trace file (default: a generated multi-turn trace)")
	f.StringVar(&gen, "gen", "", "generator parameters, name=value,... (see above)")
	f.StringVar(&fractions, "fractions", "0.1,0.25", "DRAM tier sizes as fractions of the trace's distinct blocks")
	f.IntVar(&blockBytes, "block-bytes", 16<<10, "bytes per block")
	f.StringVar(&dir, "dir", "", "working directory (default: a temp dir)")
	f.StringVar(&policy, "policy", "auto", "the server's KV DRAM policy (gd2fs up --kv-policy): auto, s3fifo, lru; with --disk a comma-separated list")
	f.Float64Var(&disk, "disk", 0, "KV disk tier as a fraction of the distinct blocks' bytes (0: none; 1: every block)")
	return cmd
}

type traceRun struct {
	blocks, hits, moved int64
	elapsed             time.Duration
}

func (r traceRun) ratio() float64 {
	if r.blocks == 0 {
		return 0
	}
	return float64(r.hits) / float64(r.blocks)
}

// replayOverWire starts a one-server cluster with mem bytes of KV DRAM and
// no KV disk tier, and replays reqs through the Go client.
func replayOverWire(ctx context.Context, dir string, reqs []kvtrace.Request, mem int64, blockBytes int, policy string) (traceRun, error) {
	var res traceRun
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return res, err
	}
	up, url, err := gd2fsUp(ctx, dir, 1, "--kv-mem", strconv.FormatInt(mem, 10), "--kv-disk", "0", "--resp-port", "0", "--kv-policy", policy)
	if err != nil {
		return res, err
	}
	defer stopProc(up)
	cl, err := client.New(client.Config{Master: url})
	if err != nil {
		return res, err
	}
	defer cl.Close()
	kv := cl.KV("perf")
	val := make([]byte, blockBytes)
	var keys []string
	var dsts [][]byte
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
			ns, err := kv.BatchGetInto(ctx, keys[:run], dsts[:run])
			if err != nil {
				return res, fmt.Errorf("request %d: get: %w", n, err)
			}
			for _, m := range ns {
				if m < 0 {
					break // evicted between the check and the get: the run ends here
				}
				hits++
			}
		}
		if rest := keys[hits:]; len(rest) > 0 {
			vals := make([][]byte, len(rest))
			for i := range vals {
				vals[i] = val
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
	return res, nil
}
