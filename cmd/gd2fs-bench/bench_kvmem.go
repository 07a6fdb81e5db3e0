package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/gd2fs/gd2fs/client"
	"github.com/gd2fs/gd2fs/internal/master"
	"github.com/gd2fs/gd2fs/internal/meta"
	"github.com/spf13/cobra"
)

func newBenchKVMemory() *cobra.Command {
	var total, valueSize, mem string
	cmd := &cobra.Command{
		Use:   "kv-memory",
		Short: "GC time and RSS of a KV server process as stored data grows (off-heap DRAM tier)",
		Example: `  gd2fs-bench kv-memory                        # 8 GiB of 1 MiB blocks, figures at 0, 1, 2, 4, 8 GiB
  gd2fs-bench kv-memory --total 2GiB --kv-mem 3GiB`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			tot, err := parseSize(total)
			if err != nil {
				return err
			}
			vs, err := parseSize(valueSize)
			if err != nil {
				return err
			}
			if mem == "" {
				mem = strconv.FormatInt(tot+tot/8, 10)
			}
			memB, err := parseSize(mem)
			if err != nil {
				return err
			}
			dir, err := os.MkdirTemp("", "gd2fs-kvmem-")
			if err != nil {
				return err
			}
			defer os.RemoveAll(dir)
			ctx := context.Background()
			ms, err := meta.Open(ctx, "sqlite://"+filepath.Join(dir, "meta.db"))
			if err != nil {
				return err
			}
			defer ms.Close()
			m, err := master.New(ctx, master.Config{Listen: "127.0.0.1:0", Meta: ms})
			if err != nil {
				return err
			}
			mctx, stop := context.WithCancel(ctx)
			defer stop()
			go m.Run(mctx)
			l, _ := net.Listen("tcp", "127.0.0.1:0")
			addr := l.Addr().String()
			l.Close()
			bin, err := gd2fsPath()
			if err != nil {
				return err
			}
			srv := exec.Command(bin, "server", "--master", m.URL(), "--listen", addr, "--mem", "0",
				"--disk", filepath.Join(dir, "chunks")+":64MiB", "--kv-mem", strconv.FormatInt(memB, 10), "--debug-http")
			srv.Stderr = os.Stderr
			dieWithUs(srv)
			if err := srv.Start(); err != nil {
				return err
			}
			defer func() { srv.Process.Kill(); srv.Wait() }()
			cl, err := client.New(client.Config{Master: m.URL()})
			if err != nil {
				return err
			}
			defer cl.Close()
			for i := 0; ; i++ {
				if st, err := cl.Status(ctx); err == nil && len(st.Servers) == 1 && st.Servers[0].State == "up" {
					break
				}
				if i > 200 {
					return fmt.Errorf("server did not come up")
				}
				time.Sleep(50 * time.Millisecond)
			}
			kv := cl.KV("perf")
			value := make([]byte, vs)
			for i := range value {
				value[i] = byte(i)
			}
			fmt.Printf("bench kv-memory: one server process, KV DRAM tier %s (off-heap), %s values\n", human(memB), human(vs))
			fmt.Printf("%10s %12s %14s %12s %14s %16s %12s %10s\n", "stored", "RSS", "RSS - stored", "Go heap", "heap objects", "forced GC wall", "STW pause", "GCs so far")
			var stored int64
			next := int64(0)
			for i := 0; ; i++ {
				if stored >= next {
					gc, err := debugGC(addr)
					if err != nil {
						return err
					}
					rss := procRSS(srv.Process.Pid)
					fmt.Printf("%10s %12s %14s %12s %14d %16s %12s %10d\n", human(stored), human(rss), human(rss-stored),
						human(gc.HeapAlloc), gc.HeapObjects, time.Duration(gc.GC*1e9).Round(time.Microsecond),
						time.Duration(gc.Pause*1e9).Round(time.Microsecond), gc.NumGC)
					if next == 0 {
						next = 1 << 30
					} else {
						next *= 2
					}
					if stored >= tot {
						return nil
					}
					next = min(next, tot)
				}
				if err := kv.Put(ctx, fmt.Sprintf("mem/%08d", i), value); err != nil {
					return err
				}
				stored += vs
			}
		},
	}
	f := cmd.Flags()
	f.StringVar(&total, "total", "8GiB", "bytes to store")
	f.StringVar(&valueSize, "value", "1MiB", "value size")
	f.StringVar(&mem, "kv-mem", "", "KV DRAM tier (default: total + 1/8)")
	return cmd
}

type gcReport struct {
	GC          float64 `json:"gc_seconds"`
	HeapAlloc   int64   `json:"heap_alloc"`
	HeapObjects int64   `json:"heap_objects"`
	NumGC       int64   `json:"num_gc"`
	Pause       float64 `json:"last_pause_seconds"`
}

func debugGC(addr string) (gcReport, error) {
	var r gcReport
	resp, err := http.Get("http://" + addr + "/debug/gc")
	if err != nil {
		return r, err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return r, json.Unmarshal(b, &r)
}

// procRSS reads VmRSS of pid in bytes (0 if unknown).
func procRSS(pid int) int64 {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if strings.HasPrefix(sc.Text(), "VmRSS:") {
			fs := strings.Fields(sc.Text())
			if len(fs) >= 2 {
				kb, _ := strconv.ParseInt(fs[1], 10, 64)
				return kb << 10
			}
		}
	}
	return 0
}
