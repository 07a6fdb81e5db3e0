package main

import (
	"context"
	"encoding/csv"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/gd2fs/gd2fs/internal/bench"
	"github.com/spf13/cobra"
)

// newBenchRESP runs redis-benchmark against a gd2fs server's Redis-protocol
// port and against redis-server, alternating, in the same run (issue 26,
// item 5): the RESP door's SET and GET beside Redis itself.
func newBenchRESP() *cobra.Command {
	var servers, clients, requests, keys, runs int
	var size string
	cmd := &cobra.Command{
		Use:   "resp",
		Short: "redis-benchmark SET and GET against a gd2fs server's Redis-protocol port beside redis-server",
		Long: `Starts 'gd2fs up' (its own processes, master and --servers servers, each with a Redis-protocol
port) and a redis-server, then runs redis-benchmark -t set,get against the first server's port
and against Redis in turn, --runs times, and prints the medians, their ratio and each server's
CPU seconds per GiB of values moved (the processes' own, not redis-benchmark's). With more than
one server, a key the first server does not own is forwarded to its owner: --servers 1 measures
the local path alone. Needs redis-server and redis-benchmark (Debian package redis-server).`,
		Example: `  gd2fs-bench resp                               # 1 MiB values, 4 clients, 600 requests, 64 keys, 3 runs
  gd2fs-bench resp --servers 1                   # every key on the server asked: no forwarding
  gd2fs-bench resp --size 64KiB --clients 16 --requests 5000`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			sz, err := parseSize(size)
			if err != nil {
				return err
			}
			if sz <= 0 || sz > 512<<20 || servers < 1 || clients < 1 || requests < 1 || keys < 1 || runs < 1 {
				return fmt.Errorf("resp: --size must be 1 byte to 512 MiB and --servers, --clients, --requests, --keys, --runs at least 1")
			}
			rb, err := exec.LookPath("redis-benchmark")
			if err != nil {
				return fmt.Errorf("redis-benchmark not found: install it (apt-get install -y redis-server)")
			}
			dir, err := os.MkdirTemp("", "gd2fs-bench-resp-")
			if err != nil {
				return err
			}
			defer os.RemoveAll(dir)
			port, err := freePorts(servers)
			if err != nil {
				return err
			}
			// The KV DRAM tier holds every key on every server it could
			// land on, so GETs are DRAM hits as they are in Redis.
			kvMem := max(256<<20, 2*int64(keys)*sz)
			gd, _, err := gd2fsUp(context.Background(), dir, servers, "--resp-port", strconv.Itoa(port),
				"--kv-mem", strconv.FormatInt(kvMem, 10), "--mem", "64MiB", "--kv-disk", "0")
			if err != nil {
				return err
			}
			defer stopProc(gd)
			rd, raddr, err := startRedis(dir)
			if err != nil {
				return err
			}
			defer stopProc(rd)
			_, rport, _ := net.SplitHostPort(raddr)
			targets := []struct {
				name, port string
				pid        int
			}{{"gd2fs", strconv.Itoa(port), gd.Process.Pid}, {"redis", rport, rd.Process.Pid}}
			fmt.Printf("bench resp: redis-benchmark -t set,get -d %d -c %d -n %d -r %d, gd2fs (%d servers, server 1's port) and redis-server alternating, %d runs (medians)\n",
				sz, clients, requests, keys, servers, runs)
			rps, cpu := map[string][]float64{}, map[string][]float64{}
			for r := range runs {
				for _, t := range targets {
					m := newCPUMeter(t.pid)
					m.pids = m.pids[1:] // the server process only: redis-benchmark's CPU is the same for both
					m.Start()
					got, err := redisBenchmark(rb, t.port, sz, clients, requests, keys)
					if err != nil {
						return fmt.Errorf("%s: %w", t.name, err)
					}
					c := m.Stop(2 * int64(requests) * sz)
					for test, v := range got {
						rps[t.name+" "+test] = append(rps[t.name+" "+test], v)
					}
					cpu[t.name] = append(cpu[t.name], c)
					fmt.Fprintf(os.Stderr, "  run %d/%d %s: SET %.0f/s, GET %.0f/s, %.2f CPU s/GiB\n", r+1, runs, t.name, got["SET"], got["GET"], c)
				}
			}
			tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', tabwriter.AlignRight)
			fmt.Fprintln(tw, "test\tgd2fs req/s\tredis req/s\tgd2fs vs redis\ttarget\t")
			for _, test := range []string{"SET", "GET"} {
				g, rr := bench.Median(rps["gd2fs "+test]), bench.Median(rps["redis "+test])
				fmt.Fprintf(tw, "%s\t%.0f\t%.0f\t%.2fx\t>= 1.0x\t\n", test, g, rr, g/rr)
			}
			g, rr := bench.Median(cpu["gd2fs"]), bench.Median(cpu["redis"])
			fmt.Fprintf(tw, "server CPU s/GiB (SET+GET)\t%.2f\t%.2f\t%.2fx\t\t\n", g, rr, g/rr)
			return tw.Flush()
		},
	}
	f := cmd.Flags()
	f.IntVar(&servers, "servers", 3, "gd2fs servers (keys the first does not own are forwarded to their owner)")
	f.StringVar(&size, "size", "1MiB", "value size (redis-benchmark -d)")
	f.IntVar(&clients, "clients", 4, "parallel connections (redis-benchmark -c)")
	f.IntVar(&requests, "requests", 600, "requests per test (redis-benchmark -n)")
	f.IntVar(&keys, "keys", 64, "distinct keys (redis-benchmark -r)")
	f.IntVar(&runs, "runs", 3, "alternating runs; medians are reported")
	return cmd
}

// redisBenchmark runs redis-benchmark's set and get tests against the
// Redis-protocol port on loopback and returns requests/second per test.
func redisBenchmark(bin, port string, size int64, clients, requests, keys int) (map[string]float64, error) {
	out, err := exec.Command(bin, "-h", "127.0.0.1", "-p", port, "-t", "set,get", "-d", strconv.FormatInt(size, 10),
		"-c", strconv.Itoa(clients), "-n", strconv.Itoa(requests), "-r", strconv.Itoa(keys), "--csv").Output()
	if err != nil {
		return nil, fmt.Errorf("redis-benchmark: %w", err)
	}
	recs, err := csv.NewReader(strings.NewReader(string(out))).ReadAll()
	if err != nil {
		return nil, fmt.Errorf("redis-benchmark output %q: %w", out, err)
	}
	got := map[string]float64{}
	for _, rec := range recs {
		if len(rec) < 2 || rec[0] == "test" {
			continue
		}
		v, err := strconv.ParseFloat(rec[1], 64)
		if err != nil {
			return nil, fmt.Errorf("redis-benchmark output %q: %w", rec, err)
		}
		got[rec[0]] = v
	}
	if got["SET"] == 0 || got["GET"] == 0 {
		return nil, fmt.Errorf("redis-benchmark printed no SET and GET rates: %q", out)
	}
	return got, nil
}

// freePorts finds n consecutive free loopback ports (gd2fs up gives server
// i the Redis-protocol port first+i) and returns the first.
func freePorts(n int) (int, error) {
	for try := 0; try < 50; try++ {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return 0, err
		}
		first := l.Addr().(*net.TCPAddr).Port
		ls := []net.Listener{l}
		ok := true
		for i := 1; i < n && ok; i++ {
			li, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(first+i))
			if ok = err == nil; ok {
				ls = append(ls, li)
			}
		}
		for _, l := range ls {
			l.Close()
		}
		if ok {
			return first, nil
		}
	}
	return 0, fmt.Errorf("no %d consecutive free loopback ports", n)
}
