package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/gd2fs/gd2fs/client"
	"github.com/gd2fs/gd2fs/errs"
	"github.com/gd2fs/gd2fs/internal/bench"
	"github.com/gd2fs/gd2fs/internal/cluster"
	"github.com/redis/go-redis/v9"
	"github.com/spf13/cobra"
)

type gdTarget struct {
	kv     *client.KV
	prefix string
}

func (t gdTarget) Set(ctx context.Context, k string, v []byte) error { return t.kv.Put(ctx, k, v) }
func (t gdTarget) Get(ctx context.Context, k string, dst []byte) (int, error) {
	return t.kv.GetInto(ctx, k, dst)
}
func (t gdTarget) MGet(ctx context.Context, keys []string, dsts [][]byte) error {
	ns, err := t.kv.BatchGetInto(ctx, keys, dsts)
	if err != nil {
		return err
	}
	for i, n := range ns {
		if n < 0 {
			// A batch counts an owner it could not reach as a miss (the
			// engine recomputes); say which key, and ask it alone for why.
			_, gerr := t.kv.GetInto(ctx, keys[i], dsts[i])
			return fmt.Errorf("gd2fs: %s missed in a batch of %d (asked alone: %v)", keys[i], len(keys), gerr)
		}
	}
	return nil
}
func (t gdTarget) Clear(ctx context.Context) error {
	_, err := t.kv.DeleteByPrefix(ctx, t.prefix)
	return err
}

type redisTarget struct{ c *redis.Client }

func (t redisTarget) Set(ctx context.Context, k string, v []byte) error {
	return t.c.Set(ctx, k, v, 0).Err()
}
func (t redisTarget) Get(ctx context.Context, k string, dst []byte) (int, error) {
	b, err := t.c.Get(ctx, k).Bytes()
	return copy(dst, b), err
}
func (t redisTarget) MGet(ctx context.Context, keys []string, dsts [][]byte) error {
	vs, err := t.c.MGet(ctx, keys...).Result()
	if err != nil {
		return err
	}
	for i, v := range vs {
		s, ok := v.(string)
		if !ok {
			return errors.New("redis: miss in MGET")
		}
		copy(dsts[i], s)
	}
	return nil
}
func (t redisTarget) Clear(ctx context.Context) error { return t.c.FlushAll(ctx).Err() }

// startRedis runs Debian's redis-server on a free loopback port, without persistence.
func startRedis(dir string) (*exec.Cmd, string, error) {
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		return nil, "", fmt.Errorf("redis-server not found: install it (apt-get install -y redis-server) to run this benchmark")
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, "", err
	}
	addr := l.Addr().String()
	l.Close()
	_, port, _ := net.SplitHostPort(addr)
	cmd := exec.Command(bin, "--bind", "127.0.0.1", "--port", port, "--save", "", "--appendonly", "no",
		"--dir", dir, "--protected-mode", "no", "--proto-max-bulk-len", "128mb", "--client-query-buffer-limit", "1gb")
	dieWithUs(cmd)
	if err := cmd.Start(); err != nil {
		return nil, "", err
	}
	for i := 0; i < 100; i++ {
		if c, err := net.Dial("tcp", addr); err == nil {
			c.Close()
			return cmd, addr, nil
		}
		time.Sleep(50 * time.Millisecond)
	}
	cmd.Process.Kill()
	return nil, "", errors.New("redis-server did not start")
}

func newBenchKV() *cobra.Command {
	var sizes, concs, mem, dataPer, dir string
	var servers, batch int
	var skipDisk, diskOnly bool
	cmd := &cobra.Command{
		Use:   "kv",
		Short: "KV cache SET/GET/batched GET beside Redis and raw loopback TCP, plus reads from the disk tier beside fio",
		Example: `  gd2fs-bench kv                                  # 64KiB,1MiB,4MiB x concurrency 1,4,16
  gd2fs-bench kv --sizes 1MiB --concurrency 4 --skip-disk`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx := context.Background()
			var vs []int
			for _, s := range strings.Split(sizes, ",") {
				n, err := parseSize(s)
				if err != nil {
					return err
				}
				vs = append(vs, int(n))
			}
			var cs []int
			for _, s := range strings.Split(concs, ",") {
				n, err := strconv.Atoi(strings.TrimSpace(s))
				if err != nil || n < 1 {
					return fmt.Errorf("--concurrency %q: a comma-separated list of positive numbers", concs)
				}
				cs = append(cs, n)
			}
			per, err := parseSize(dataPer)
			if err != nil {
				return err
			}
			memB, err := parseSize(mem)
			if err != nil {
				return err
			}
			if dir == "" {
				if dir, err = os.MkdirTemp("", "gd2fs-benchkv-"); err != nil {
					return err
				}
				defer os.RemoveAll(dir)
			}
			if diskOnly {
				return benchKVDisk(ctx, dir, memB)
			}
			rcmd, raddr, err := startRedis(dir)
			if err != nil {
				return err
			}
			defer func() { rcmd.Process.Kill(); rcmd.Wait() }()
			rdb := redis.NewClient(&redis.Options{Addr: raddr, PoolSize: 64, ReadTimeout: time.Minute, WriteTimeout: time.Minute})
			defer rdb.Close()

			up, url, err := gd2fsUp(ctx, filepath.Join(dir, "cluster"), servers, "--mem", "64MiB", "--disk", "0",
				"--kv-mem", strconv.FormatInt(memB, 10), "--kv-disk", "0")
			if err != nil {
				return err
			}
			defer stopProc(up)
			cl, err := client.New(client.Config{Master: url})
			if err != nil {
				return err
			}
			defer cl.Close()
			gd := gdTarget{kv: cl.KV("perf"), prefix: "b/"}
			rd := redisTarget{c: rdb}
			ver, _ := rdb.Info(ctx, "server").Result()
			rv := "?"
			for _, l := range strings.Split(ver, "\n") {
				if strings.HasPrefix(l, "redis_version:") {
					rv = strings.TrimSpace(strings.TrimPrefix(l, "redis_version:"))
				}
			}
			fmt.Printf("bench kv: gd2fs %d server(s) in a 'gd2fs up' process (%s KV DRAM each), Redis %s (go-redis v9) on loopback, %s of data per case, %d CPUs\n",
				servers, human(memB), rv, human(per), runtime.NumCPU())
			fmt.Printf("CPU s/GiB: user+sys CPU seconds per GiB of values moved, of the server process and the benchmark process (clients), from /proc\n")
			const row = "%8s %4s %5s %12s %12s %12s %15s %15s %20s %20s %10s %10s %10s\n"
			fmt.Printf(row, "value", "conc", "op", "gd2fs MiB/s", "Redis MiB/s", "gd2fs/Redis", "loopback MiB/s", "gd2fs/loopback", "gd2fs p50 / p99", "Redis p50 / p99",
				"gd2fs CPU", "Redis CPU", "loop CPU")
			gdCPU, rdCPU, loopCPU := newCPUMeter(up.Process.Pid), newCPUMeter(rcmd.Process.Pid), newCPUMeter()
			for _, size := range vs {
				for _, conc := range cs {
					keys := max(8, int(per/int64(size)))
					loopCPU.Start()
					loop, err := bench.Loopback(int64(keys)*int64(size), conc)
					if err != nil {
						return err
					}
					loopC := loopCPU.Stop(int64(keys) * int64(size))
					for _, op := range []string{"set", "get", "mget"} {
						if op == "mget" && int64(size)*int64(batch)*int64(conc) > 4<<30 {
							continue // 128 x 4 MiB x 16 workers would need 8 GiB of buffers
						}
						kc := bench.KVCase{Op: op, ValueSize: size, Concurrency: conc, Keys: keys, Batch: batch}
						res := map[string]bench.KVResult{}
						cpu := map[string]float64{}
						for _, tc := range []struct {
							name string
							t    bench.KVTarget
							m    *cpuMeter
						}{{"gd2fs", gd, gdCPU}, {"redis", rd, rdCPU}} {
							pfx := fmt.Sprintf("b/%d", conc)
							tc.m.Start()
							r, err := bench.RunKV(ctx, tc.t, kc, pfx)
							if err != nil {
								return fmt.Errorf("%s %s %s c=%d: %w", tc.name, op, human(int64(size)), conc, err)
							}
							res[tc.name], cpu[tc.name] = r, tc.m.Stop(r.Bytes)
						}
						o, r := res["gd2fs"], res["redis"]
						fmt.Printf(row, human(int64(size)), strconv.Itoa(conc), op,
							fmt.Sprintf("%.0f", o.BytesPerSec/(1<<20)), fmt.Sprintf("%.0f", r.BytesPerSec/(1<<20)),
							fmt.Sprintf("%.2fx", o.BytesPerSec/r.BytesPerSec), fmt.Sprintf("%.0f", loop/(1<<20)),
							fmt.Sprintf("%.2fx", o.BytesPerSec/loop), dur(o.P50)+" / "+dur(o.P99), dur(r.P50)+" / "+dur(r.P99),
							fmt.Sprintf("%.2f", cpu["gd2fs"]), fmt.Sprintf("%.2f", cpu["redis"]), fmt.Sprintf("%.2f", loopC))
					}
					gd.Clear(ctx)
					rd.Clear(ctx)
				}
			}
			if skipDisk {
				return nil
			}
			return benchKVDisk(ctx, dir, memB)
		},
	}
	f := cmd.Flags()
	f.StringVar(&sizes, "sizes", "64KiB,1MiB,4MiB", "value sizes")
	f.StringVar(&concs, "concurrency", "1,4,16", "concurrent clients")
	f.StringVar(&mem, "kv-mem", "2GiB", "KV DRAM tier per server")
	f.StringVar(&dataPer, "data", "256MiB", "data written per case")
	f.StringVar(&dir, "dir", "", "working directory (default: a temp dir)")
	f.IntVar(&servers, "servers", 1, "gd2fs servers (Redis is one process)")
	f.IntVar(&batch, "batch", 128, "keys per batched GET")
	f.BoolVar(&skipDisk, "skip-disk", false, "skip the disk-tier read phase")
	f.BoolVar(&diskOnly, "disk-only", false, "run only the disk-tier read phase")
	return cmd
}

func dur(d time.Duration) string {
	switch {
	case d < time.Millisecond:
		return fmt.Sprintf("%dµs", d.Microseconds())
	default:
		return fmt.Sprintf("%.1fms", float64(d.Microseconds())/1000)
	}
}

// benchKVDisk writes 3x the DRAM tier of 1 MiB blocks to one server, then
// reads them at random with concurrency 4, beside fio's sequential read of a
// file in the same directory. Page caches are dropped first when allowed.
func benchKVDisk(ctx context.Context, dir string, _ int64) error {
	const memB = 256 << 20
	const size = 1 << 20
	kvDir := filepath.Join(dir, "disk")
	c, err := cluster.Start(ctx, cluster.Config{Dir: kvDir, Servers: 1, MemBytes: 64 << 20, KVMemBytes: memB, KVDiskBytes: 8 * memB})
	if err != nil {
		return err
	}
	defer c.Close()
	cl := c.Client()
	defer cl.Close()
	t := gdTarget{kv: cl.KV("perf")}
	keys := 3 * memB / size
	// Alternate ours and fio three times (the disk is shared and noisy) and
	// report medians.
	var ours, fios []float64
	var last bench.KVResult
	dropped := false
	var ferr error
	for run := 0; run < 3; run++ {
		// A fresh data set per run: reads of a set already read once would
		// be promoted to DRAM (S3-FIFO ghost hits) and flatter the figure.
		pfx := fmt.Sprint("d", run)
		if run > 0 {
			if _, err := t.kv.DeleteByPrefix(ctx, fmt.Sprint("d", run-1)); err != nil {
				return err
			}
		}
		if _, err := bench.RunKV(ctx, t, bench.KVCase{Op: "set", ValueSize: size, Concurrency: 4, Keys: keys}, pfx); err != nil {
			return err
		}
		dropped = dropCaches()
		r, err := bench.RunKV(ctx, t, bench.KVCase{Op: "get", ValueSize: size, Concurrency: 4, Keys: keys}, pfx)
		if err != nil && !errors.Is(err, errs.ErrNotFound) {
			return err
		}
		ours, last = append(ours, r.BytesPerSec), r
		var bw float64
		if bw, ferr = fioSeqRead(kvDir, 3*memB); ferr == nil {
			fios = append(fios, bw)
		}
	}
	st := c.Servers[0].KV().Stats()
	fmt.Printf("\nKV reads with a data set 3x the DRAM tier (%s DRAM, %d x 1 MiB blocks, concurrency 4, page cache dropped: %v, 3 runs alternating with fio, medians):\n", human(memB), keys, dropped)
	fmt.Printf("  gd2fs GET %.0f MiB/s (last run p50 %s, p99 %s); served from disk %d, from DRAM %d over all runs\n", bench.Median(ours)/(1<<20), dur(last.P50), dur(last.P99), st.DiskHits, st.MemHits)
	if ferr != nil || len(fios) == 0 {
		fmt.Printf("  fio: %v\n", ferr)
		return nil
	}
	fmt.Printf("  fio sequential read (1 MiB blocks, same directory): %.0f MiB/s\n  ratio %.2fx (target >= 0.50x)\n", bench.Median(fios)/(1<<20), bench.Median(ours)/bench.Median(fios))
	return nil
}

func dropCaches() bool {
	exec.Command("sync").Run()
	return os.WriteFile("/proc/sys/vm/drop_caches", []byte("3\n"), 0o200) == nil
}

func fioSeqRead(dir string, size int64) (float64, error) {
	bin, err := exec.LookPath("fio")
	if err != nil {
		return 0, fmt.Errorf("fio not found: install it (apt-get install -y fio) for the reference figure")
	}
	file := filepath.Join(dir, "fio.dat")
	defer os.Remove(file)
	// Lay the file out first, then drop caches so the read comes from disk.
	if out, err := exec.Command(bin, "--name=lay", "--filename="+file, "--rw=write", "--bs=1M", "--size="+strconv.FormatInt(size, 10), "--output-format=json").CombinedOutput(); err != nil {
		return 0, fmt.Errorf("fio layout: %v: %s", err, out)
	}
	dropCaches()
	out, err := exec.Command(bin, "--name=seq", "--filename="+file, "--rw=read", "--bs=1M", "--size="+strconv.FormatInt(size, 10), "--output-format=json").Output()
	if err != nil {
		return 0, fmt.Errorf("fio: %v", err)
	}
	var res struct {
		Jobs []struct {
			Read struct {
				BW int64 `json:"bw_bytes"`
			} `json:"read"`
		} `json:"jobs"`
	}
	if err := json.Unmarshal(out, &res); err != nil || len(res.Jobs) == 0 {
		return 0, fmt.Errorf("fio output: %v", err)
	}
	return float64(res.Jobs[0].Read.BW), nil
}
