package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/gd2fs/gd2fs/client"
	"github.com/gd2fs/gd2fs/internal/bench"
	"github.com/gd2fs/gd2fs/internal/cluster"
	"github.com/gd2fs/gd2fs/internal/store"
	"github.com/spf13/cobra"
)

func newBenchFiles() *cobra.Command {
	var size, chunk, mem, disk, dir, syncPolicy, profDir, waitDir string
	var prefault, hugeBuffers bool
	var streams, parallel, runs int
	cmd := &cobra.Command{
		Use:   "files",
		Short: "Sequential write and read of a large file through a local 3-server cluster, beside raw loopback TCP",
		Example: `  gd2fs-bench files                       # 1 GiB, perf and ha pools, 3 runs, medians
  gd2fs-bench files --size 256MiB --runs 5 --streams 2
  gd2fs-bench files --sync never          # servers ack from the page cache (the figures before issue 14)
  gd2fs-bench files --cpuprofile /tmp/p   # a CPU profile per case and run: go tool pprof -top /tmp/p/ha-write-*.pprof
  gd2fs-bench files --waitprofile /tmp/w  # where goroutines wait (locks, channels): go tool pprof -top /tmp/w/perf-write-2.block
  gd2fs-bench files --huge-buffers        # the client's buffers and the references' on transparent huge pages
  # Each run also measures the limits: raw loopback TCP on as many streams, memmove, and the disk
  # (fio if installed, else a Go writer) writing as the pools do with the servers' sync policy.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			sz, err := parseSize(size)
			if err != nil {
				return err
			}
			bench.HugeBuffers = hugeBuffers
			cs, err := parseSize(chunk)
			if err != nil {
				return err
			}
			memB, err := parseSize(mem)
			if err != nil {
				return err
			}
			diskB := 4 * sz
			if disk != "auto" {
				if diskB, err = parseSize(disk); err != nil {
					return err
				}
			}
			if dir == "" {
				if dir, err = os.MkdirTemp("", "gd2fs-bench-"); err != nil {
					return err
				}
				defer os.RemoveAll(dir)
			}
			ctx := context.Background()
			const servers = 3
			sp, err := store.ParseSyncPolicy(syncPolicy)
			if err != nil {
				return err
			}
			c, err := cluster.Start(ctx, cluster.Config{Dir: filepath.Join(dir, "cluster"), Servers: servers,
				MemBytes: memB, DiskBytes: diskB, Sync: sp, Prefault: prefault})
			if err != nil {
				return err
			}
			defer c.Close()
			for _, s := range c.Servers {
				<-s.Prefaulted() // a server that has run until its tiers were full
			}
			cl, err := client.New(client.Config{Master: c.Master.URL(), Streams: streams, Parallel: parallel})
			if err != nil {
				return err
			}
			defer cl.Close()
			data := bench.Buffer(sz)
			for i := range data {
				data[i] = byte(i*7 + i>>13)
			}
			dst := bench.Buffer(sz)
			copy(dst, data) // touched once, as data is: run 1 must not pay the first touch of fresh memory
			tcpStreams := streams * servers
			bufs := "Go slices, 4 KiB pages"
			if hugeBuffers {
				bufs = "transparent huge pages"
			}
			fmt.Printf("bench files: %s file, chunk %s, %d servers (%s DRAM, %s disk each) x %d streams = %d TCP streams, %d requests in flight, %d runs (medians); client and reference buffers: %s\n",
				human(sz), human(cs), servers, human(memB), human(diskB), streams, tcpStreams, parallel, runs, bufs)

			// Master, servers, client and the loopback reference all run in
			// this process: its CPU time per GiB is each case's cost.
			results, cpu := map[string][]float64{}, map[string][]float64{}
			meter := newCPUMeter()
			const piece = 4 << 20 // the client's request size (client.Config.PieceSize's default)
			diskTool, diskEvery := "", map[string]int64{}
			prof := &caseProfiler{dir: profDir, waitDir: waitDir}
			defer prof.stop() // a case that failed leaves its profile complete
			for r := 0; r < runs; r++ {
				meter.Start()
				prof.start("loopback", r)
				raw, err := bench.Loopback(sz, tcpStreams)
				prof.stop()
				if err != nil {
					return err
				}
				results["raw"] = append(results["raw"], raw)
				cpu["raw"] = append(cpu["raw"], meter.Stop(sz))
				for _, pool := range []string{"perf", "ha"} {
					p := fmt.Sprintf("/bench/%s-%d", pool, r)
					meter.Start()
					prof.start(pool+"-write", r)
					start := time.Now()
					f, err := cl.Create(ctx, p, client.CreateOptions{Pool: pool, ChunkSize: cs})
					if err != nil {
						return err
					}
					if _, err := f.WriteAt(data, 0); err != nil {
						return err
					}
					acked := time.Since(start)
					if err := f.Close(); err != nil {
						return err
					}
					// Close records the file at the master, whose
					// database commit on one box flushes the device's
					// cache of every O_DIRECT write before it: shown
					// apart, as the write without its Close.
					results[pool+" acked"] = append(results[pool+" acked"], float64(sz)/acked.Seconds())
					results[pool+" close"] = append(results[pool+" close"], (time.Since(start) - acked).Seconds())
					results[pool+" write"] = append(results[pool+" write"], float64(sz)/time.Since(start).Seconds())
					prof.stop()
					cpu[pool+" write"] = append(cpu[pool+" write"], meter.Stop(sz))
					rf, err := cl.Open(ctx, p)
					if err != nil {
						return err
					}
					meter.Start()
					prof.start(pool+"-read", r)
					start = time.Now()
					if _, err := rf.ReadAt(dst, 0); err != nil {
						return err
					}
					prof.stop()
					results[pool+" read"] = append(results[pool+" read"], float64(sz)/time.Since(start).Seconds())
					cpu[pool+" read"] = append(cpu[pool+" read"], meter.Stop(sz))
					if dst[sz/2] != data[sz/2] || dst[sz-1] != data[sz-1] {
						return fmt.Errorf("bench: read back wrong bytes")
					}
					if err := cl.Remove(ctx, p); err != nil {
						return err
					}
				}
				// Let the servers finish deleting this run's chunks (they do it
				// after their next heartbeat) so the next run does not
				// measure the deletion work too.
				for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
					held := 0
					for _, s := range c.Servers {
						held += s.Store().Usage().Chunks
					}
					if held == 0 {
						break
					}
				}
				fmt.Fprintf(os.Stderr, "  run %d/%d (MiB/s, CPU s/GiB):", r+1, runs)
				for _, k := range []string{"raw", "perf write", "perf read", "ha write", "ha read"} {
					fmt.Fprintf(os.Stderr, " %s %.0f, %.2f;", k, results[k][r]/(1<<20), cpu[k][r])
				}
				fmt.Fprintln(os.Stderr)
			}
			// The limits, measured after every run of the cases: the disk
			// references fill and free as much page cache as a run does, and
			// on a VM freed memory is slow to use again, which would charge
			// the cases that followed them.
			for r := range runs {
				results["memmove"] = append(results["memmove"], bench.Memmove(dst, data))
				if diskB > 0 {
					// The disk with the servers' sync policy, on the file
					// system of their disk tiers: a perf write puts one
					// copy of the file over the servers, an ha write a
					// copy on each, fdatasynced per request.
					for _, pool := range []string{"perf", "ha"} {
						per, every := sz/servers, int64(0)
						if pool == "ha" {
							per = sz
						}
						if sp == store.SyncAlways || pool == "ha" && sp == store.SyncReplicated {
							every = piece
						}
						v, tool, err := bench.DiskWrite(dir, servers, per, every)
						if err != nil {
							return err
						}
						// In bytes of the file per second: what the
						// pool's write can reach at most.
						results[pool+" disk"] = append(results[pool+" disk"], v*float64(sz)/float64(per*servers))
						diskTool, diskEvery[pool] = tool, every
					}
					// A perf write goes to the disk tier with O_DIRECT
					// from the DRAM pages: its own limit is the device's.
					// And with the flush at the end that makes the
					// device hold the bytes, which a perf write's Close
					// pays on one box (above).
					if sp != store.SyncAlways {
						for _, flush := range []bool{false, true} {
							v, ok, err := bench.DiskWriteDirect(dir, servers, sz/servers, flush)
							if err != nil {
								return err
							}
							if ok {
								k := map[bool]string{false: "perf direct", true: "perf flushed"}[flush]
								results[k] = append(results[k], v)
							}
						}
					}
				}
				fmt.Fprintf(os.Stderr, "  limits %d/%d (MiB/s):", r+1, runs)
				for _, k := range []string{"memmove", "perf disk", "perf direct", "perf flushed", "ha disk"} {
					if len(results[k]) > r {
						fmt.Fprintf(os.Stderr, " %s %.0f;", k, results[k][r]/(1<<20))
					}
				}
				fmt.Fprintln(os.Stderr)
			}
			raw := bench.Median(results["raw"])
			tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', tabwriter.AlignRight)
			rawCPU := bench.Median(cpu["raw"])
			fmt.Fprintln(tw, "case\tMiB/s (median)\tvs raw loopback\ttarget\tvs disk limit\ttarget\tCPU s/GiB (median)\tCPU vs loopback\ttarget\t")
			fmt.Fprintf(tw, "raw loopback TCP, %d streams\t%.0f\t1.00x\t\t\t\t%.2f\t1.00x\t\t\n", tcpStreams, raw/(1<<20), rawCPU)
			fmt.Fprintf(tw, "memmove (copy of the file in memory)\t%.0f\t%.2fx\t\t\t\t\t\t\t\n", bench.Median(results["memmove"])/(1<<20), bench.Median(results["memmove"])/raw)
			for _, pool := range []string{"perf", "ha"} {
				if v := results[pool+" disk"]; len(v) > 0 {
					what := "page cache"
					if e := diskEvery[pool]; e > 0 {
						what = "fdatasync every " + human(e)
					}
					copies := map[string]string{"perf": "1 copy", "ha": fmt.Sprintf("%d copies", servers)}[pool]
					fmt.Fprintf(tw, "disk limit, %s write: %s, %d writers, %s, %s\t%.0f\t%.2fx\t\t\t\t\t\t\t\n", pool, diskTool, servers, what, copies, bench.Median(v)/(1<<20), bench.Median(v)/raw)
				}
			}
			if v := results["perf direct"]; len(v) > 0 {
				fmt.Fprintf(tw, "disk limit, perf write: fio --direct=1 (O_DIRECT, as the servers write), %d writers, 1 copy\t%.0f\t%.2fx\t\t\t\t\t\t\t\n", servers, bench.Median(v)/(1<<20), bench.Median(v)/raw)
			}
			if v := results["perf flushed"]; len(v) > 0 {
				fmt.Fprintf(tw, "disk limit, perf write: the same with --end_fsync=1 (the device holds the bytes)\t%.0f\t%.2fx\t\t\t\t\t\t\t\n", bench.Median(v)/(1<<20), bench.Median(v)/raw)
			}
			type target struct{ raw, disk, cpu string }
			targets := map[string]target{"perf write": {">= 0.60x", "", "<= 1.5x"}, "perf read": {">= 0.85x", "", "<= 1.1x"},
				"ha write": {">= 0.25x (no disk)", ">= 0.90x", "<= 4x"}, "ha read": {}}
			for _, k := range []string{"perf write", "perf read", "ha write", "ha read"} {
				v, c := bench.Median(results[k]), bench.Median(cpu[k])
				vsDisk := ""
				if d := results[k[:len(k)-len(" write")]+" disk"]; len(d) > 0 && k[len(k)-5:] == "write" {
					vsDisk = fmt.Sprintf("%.2fx", v/bench.Median(d))
				}
				if d := results["perf direct"]; k == "perf write" && len(d) > 0 && diskB > 0 {
					vsDisk += fmt.Sprintf(", %.2fx direct", v/bench.Median(d))
				}
				if d := results["perf flushed"]; k == "perf write" && len(d) > 0 && diskB > 0 {
					vsDisk += fmt.Sprintf(", %.2fx flushed", v/bench.Median(d))
				}
				t := targets[k]
				fmt.Fprintf(tw, "%s\t%.0f\t%.2fx\t%s\t%s\t%s\t%.2f\t%.2fx\t%s\t\n", k, v/(1<<20), v/raw, t.raw, vsDisk, t.disk, c, c/rawCPU, t.cpu)
				if strings.HasSuffix(k, "write") {
					pool := strings.TrimSuffix(k, " write")
					a := bench.Median(results[pool+" acked"])
					vsDisk = ""
					if d := results["perf direct"]; pool == "perf" && len(d) > 0 && diskB > 0 {
						vsDisk = fmt.Sprintf("%.2fx direct", a/bench.Median(d))
					}
					fmt.Fprintf(tw, "  of which writes acked (Close not counted; Close took %.0f ms)\t%.0f\t%.2fx\t\t%s\t\t\t\t\t\n",
						bench.Median(results[pool+" close"])*1000, a/(1<<20), a/raw, vsDisk)
				}
			}
			return tw.Flush()
		},
	}
	f := cmd.Flags()
	f.StringVar(&size, "size", "1GiB", "file size")
	f.StringVar(&chunk, "chunk-size", "16MiB", "chunk size")
	f.StringVar(&mem, "mem", "2GiB", "DRAM tier per server")
	f.BoolVar(&hugeBuffers, "huge-buffers", false, "the client's file buffers, and the loopback and disk references' buffers, on transparent huge pages (madvise) instead of Go slices (4 KiB pages): on a VM the kernel's copies from and into 4 KiB pages cost more")
	f.BoolVar(&prefault, "prefault", true, "make the servers' DRAM tiers resident before measuring (gd2fs server --mem-prefault), as on servers that have run until their tiers were full; false: the first run's writes fault them in")
	f.StringVar(&disk, "disk", "auto", "disk tier per server (auto: 4x the file size; 0: DRAM only)")
	f.StringVar(&dir, "dir", "", "where the servers keep their disk tiers (default: a temp dir)")
	f.StringVar(&syncPolicy, "sync", "replicated", "servers' write durability: replicated (ha writes fdatasynced before the ack), always, never (page cache only)")
	f.IntVar(&streams, "streams", 4, "TCP streams per server")
	f.IntVar(&parallel, "parallel", 16, "requests in flight")
	f.IntVar(&runs, "runs", 3, "repetitions; medians are reported")
	f.StringVar(&waitDir, "waitprofile", "", "write a block and a mutex profile of each case and run into this folder (<case>-<run>.block, .mutex): time goroutines spent waiting on channels, locks and conditions (not on sockets or disks)")
	f.StringVar(&profDir, "cpuprofile", "", "write a CPU profile of each case and run into this folder (<case>-<run>.pprof); the client and the servers run in this process, so each profile holds all of them")
	return cmd
}

// caseProfiler writes a CPU profile of each measured case, when a folder
// is given. Profiling costs a few percent: compare runs made with it only
// to runs made with it.
type caseProfiler struct {
	dir, waitDir string
	name         string // the case and run being profiled
	f            *os.File
}

func (p *caseProfiler) start(name string, run int) {
	p.name = fmt.Sprintf("%s-%d", name, run+1)
	if p.waitDir != "" {
		runtime.SetBlockProfileRate(1)
		runtime.SetMutexProfileFraction(1)
	}
	if p.dir == "" {
		return
	}
	if err := os.MkdirAll(p.dir, 0o755); err != nil {
		fmt.Fprintf(os.Stderr, "cpuprofile: %v\n", err)
		return
	}
	f, err := os.Create(filepath.Join(p.dir, p.name+".pprof"))
	if err != nil {
		fmt.Fprintf(os.Stderr, "cpuprofile: %v\n", err)
		return
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		fmt.Fprintf(os.Stderr, "cpuprofile: %v\n", err)
		f.Close()
		return
	}
	p.f = f
}

// stopWait writes the case's block and mutex profiles and turns both off.
// The profiles are cumulative since the process started: each case's is
// the whole count at its end, so compare one case's run to itself, or
// subtract (go tool pprof -diff_base).
func (p *caseProfiler) stopWait() {
	if p.waitDir == "" || p.name == "" {
		return
	}
	runtime.SetBlockProfileRate(0)
	runtime.SetMutexProfileFraction(0)
	if err := os.MkdirAll(p.waitDir, 0o755); err != nil {
		fmt.Fprintf(os.Stderr, "waitprofile: %v\n", err)
		return
	}
	for _, kind := range []string{"block", "mutex"} {
		f, err := os.Create(filepath.Join(p.waitDir, p.name+"."+kind))
		if err != nil {
			fmt.Fprintf(os.Stderr, "waitprofile: %v\n", err)
			return
		}
		if err := pprof.Lookup(kind).WriteTo(f, 0); err != nil {
			fmt.Fprintf(os.Stderr, "waitprofile: %v\n", err)
		}
		if err := f.Close(); err != nil {
			fmt.Fprintf(os.Stderr, "waitprofile: %v\n", err)
		}
	}
}

func (p *caseProfiler) stop() {
	p.stopWait()
	p.name = ""
	if p.f == nil {
		return
	}
	pprof.StopCPUProfile()
	if err := p.f.Close(); err != nil {
		fmt.Fprintf(os.Stderr, "cpuprofile: %v\n", err)
	}
	p.f = nil
}
