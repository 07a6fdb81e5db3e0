package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/gd2fs/gd2fs/internal/server"
	"github.com/gd2fs/gd2fs/internal/store"
	"github.com/spf13/cobra"
)

func newServer(g *globals) *cobra.Command {
	var listen, advertise, mem, disk, id string
	var heartbeat time.Duration
	cmd := &cobra.Command{
		Use:   "server",
		Short: "Run a data server: chunks in a DRAM tier and a disk tier, served over the binary protocol",
		Example: `  gd2fs server --master http://m:7070 --listen :7071 --mem 16GiB --disk /nvme/gd2fs:2TiB
  gd2fs server --master http://127.0.0.1:7070 --listen 127.0.0.1:7075 --mem 1GiB   # DRAM only`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			sc := store.Config{}
			var err error
			if mem != "" {
				if sc.MemBytes, err = parseSize(mem); err != nil {
					return err
				}
			}
			if disk != "" {
				i := strings.LastIndexByte(disk, ':')
				if i <= 0 {
					return fmt.Errorf("--disk %q: write DIR:SIZE, e.g. /nvme/gd2fs:2TiB", disk)
				}
				sc.Dir = disk[:i]
				if sc.DiskBytes, err = parseSize(disk[i+1:]); err != nil {
					return err
				}
			}
			ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			s, err := server.New(server.Config{ID: id, Listen: listen, Advertise: advertise, Master: g.master,
				Token: g.token, Store: sc, Heartbeat: heartbeat, Log: g.logger()})
			if err != nil {
				return err
			}
			fmt.Fprintf(os.Stderr, "gd2fs server %s on %s (master %s)\n", s.ID(), s.Addr(), g.master)
			return s.Run(ctx)
		},
	}
	f := cmd.Flags()
	f.StringVar(&listen, "listen", ":7071", "data-plane address (also serves /metrics over HTTP)")
	f.StringVar(&advertise, "advertise", "", "address clients dial (default: the listen address)")
	f.StringVar(&mem, "mem", "1GiB", "DRAM tier capacity (0 for none)")
	f.StringVar(&disk, "disk", "", "disk tier as DIR:SIZE, e.g. /nvme/gd2fs:2TiB")
	f.StringVar(&id, "id", "", "server id (default: kept in the disk tier, else random)")
	f.DurationVar(&heartbeat, "heartbeat", time.Second, "heartbeat interval")
	return cmd
}
