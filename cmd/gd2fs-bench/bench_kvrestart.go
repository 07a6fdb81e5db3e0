package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/gd2fs/gd2fs/client"
	"github.com/spf13/cobra"
)

// newBenchKVRestart measures issue 23's restart target: after a graceful
// stop (SIGTERM) of `gd2fs up`, the share of the blocks that fit the KV disk
// tier that are hits once it is started again on the same folder.
func newBenchKVRestart() *cobra.Command {
	var blocks int
	var blockSize, dram, disk string
	cmd := &cobra.Command{
		Use:   "kv-restart",
		Short: "KV blocks still cached after `gd2fs up` is stopped with SIGTERM and started again",
		Long: `Starts 'gd2fs up' (one server, --dram of KV DRAM, --disk of KV disk) in a temporary folder, puts
--blocks blocks (most of them only in DRAM: fewer than the DRAM tier holds), stops it with SIGTERM
(it writes its DRAM-only blocks to the disk tier), starts it again on the same folder and counts the
blocks that are hits, with their bytes checked. Prints the ratio to the blocks that fit the disk
tier (target >= 0.99).`,
		Example: `  gd2fs-bench kv-restart                          # 2000 blocks of 64 KiB, 256 MiB DRAM, 1 GiB disk
  gd2fs-bench kv-restart --blocks 10000 --block-size 16KiB`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			bs, err := parseSize(blockSize)
			if err != nil {
				return err
			}
			dk, err := parseSize(disk)
			if err != nil {
				return err
			}
			if bs <= 0 || blocks <= 0 || bs > 4<<20 {
				return fmt.Errorf("--blocks must be positive and --block-size between 1 B and 4 MiB")
			}
			dir, err := os.MkdirTemp("", "gd2fs-kvrestart-")
			if err != nil {
				return err
			}
			defer os.RemoveAll(dir)
			ctx := context.Background()
			args := []string{"--kv-mem", dram, "--kv-disk", disk, "--resp-port", "0"}
			keys := make([]string, blocks)
			for i := range keys {
				keys[i] = "restart/" + strconv.Itoa(i)
			}
			val := func(i int) []byte {
				b := make([]byte, bs)
				copy(b, keys[i])
				b[len(b)-1] = byte(i)
				return b
			}
			up, url, err := gd2fsUp(ctx, dir, 1, args...)
			if err != nil {
				return err
			}
			cl, err := client.New(client.Config{Master: url})
			if err != nil {
				stopProc(up)
				return err
			}
			kv := cl.KV("perf")
			for i := 0; i < blocks; i += 64 {
				ks := keys[i:min(i+64, blocks)]
				vs := make([][]byte, len(ks))
				for j := range vs {
					vs[j] = val(i + j)
				}
				if err := kv.BatchPut(ctx, ks, vs); err != nil {
					cl.Close()
					stopProc(up)
					return err
				}
			}
			cl.Close()
			start := time.Now()
			if err := up.Process.Signal(syscall.SIGTERM); err != nil {
				return err
			}
			if err := up.Wait(); err != nil {
				return fmt.Errorf("gd2fs up after SIGTERM: %w", err)
			}
			stopped := time.Since(start)
			up, url, err = gd2fsUp(ctx, dir, 1, args...)
			if err != nil {
				return err
			}
			defer stopProc(up)
			cl, err = client.New(client.Config{Master: url})
			if err != nil {
				return err
			}
			defer cl.Close()
			kv = cl.KV("perf")
			hits := 0
			for i := 0; i < blocks; i += 64 {
				ks := keys[i:min(i+64, blocks)]
				got, err := kv.BatchGet(ctx, ks)
				if err != nil {
					return err
				}
				for j, g := range got {
					if g == nil {
						continue
					}
					if string(g) != string(val(i+j)) {
						return fmt.Errorf("key %s: wrong bytes after the restart", ks[j])
					}
					hits++
				}
			}
			fit := min(blocks, int(dk/(bs+int64(len(keys[0]))+512))) // blocks whose records fit the disk tier, roughly
			out := cmd.OutOrStdout()
			fmt.Fprintf(out, "%d blocks of %s put (KV DRAM %s, disk %s); stopped with SIGTERM in %v; %d hits after the restart: %.4f of the blocks, %.4fx of the %d that fit the disk tier (target >= 0.99)\n",
				blocks, blockSize, dram, disk, stopped.Round(time.Millisecond), hits, float64(hits)/float64(blocks), float64(hits)/float64(max(1, fit)), fit)
			if up, err := exec.Command("uptime").Output(); err == nil {
				fmt.Fprintf(out, "load: %s\n", strings.TrimSpace(string(up)))
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.IntVar(&blocks, "blocks", 2000, "blocks to put")
	f.StringVar(&blockSize, "block-size", "64KiB", "bytes per block")
	f.StringVar(&dram, "dram", "256MiB", "KV DRAM tier (gd2fs up --kv-mem)")
	f.StringVar(&disk, "disk", "1GiB", "KV disk tier (gd2fs up --kv-disk)")
	return cmd
}
