package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/gd2fs/gd2fs/internal/dirlock"
	"github.com/gd2fs/gd2fs/internal/kvstore"
	"github.com/gd2fs/gd2fs/internal/node"
	"github.com/gd2fs/gd2fs/internal/server"
	"github.com/gd2fs/gd2fs/internal/store"
	"github.com/spf13/cobra"
)

func newServer(g *globals) *cobra.Command {
	var listen, advertise, mem, disk, id, kvMem, kvDisk, kvMax, kvPolicy, kvPin, syncPolicy string
	var rf respFlags
	var heartbeat, forwardTimeout, reconcile time.Duration
	var maxConns, maxPerIP int
	var debug, prefault bool
	var s3 s3Flags
	cmd := &cobra.Command{
		Use:   "server",
		Short: "Run a data server: chunks in a DRAM tier and a disk tier, served over the binary protocol",
		Example: `  gd2fs server --master http://m:7070 --listen :7071 --mem 16GiB --disk /nvme/gd2fs:2TiB
  gd2fs server --master http://127.0.0.1:7070 --listen 127.0.0.1:7075 --mem 1GiB   # DRAM only
  gd2fs server --master http://m:7070 --disk /nvme/gd2fs:2TiB --sync always        # perf-pool writes synced too
  gd2fs server --master http://m:7070 --mem 64GiB --kv-mem 64GiB --mem-prefault     # a dedicated box: tiers resident from the start
  gd2fs server --master http://m:7070 --listen :7071 --resp-listen :6380          # and Redis clients on 6380
  gd2fs server --master https://m:7070 --tls-cert s1.pem --tls-key s1-key.pem --tls-ca ca.pem --token-file /etc/gd2fs/token ...`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			n := node.Server{ID: id, Listen: listen, Advertise: advertise, Master: g.master, Token: g.token,
				KVPolicy: kvPolicy, Heartbeat: heartbeat, Reconcile: reconcile, ForwardTimeout: forwardTimeout, Debug: debug, Log: g.logger(),
				TLS: g.serverTLS, ClientTLS: g.clientTLS, MaxConns: maxConns, MaxConnsPerIP: maxPerIP, Prefault: prefault}
			var err error
			if n.Sync, err = store.ParseSyncPolicy(syncPolicy); err != nil {
				return err
			}
			if mem != "" {
				if n.Mem, err = parseSize(mem); err != nil {
					return err
				}
			}
			if disk != "" {
				if n.Dir, n.Disk, err = dirSize("disk", disk); err != nil {
					return err
				}
			}
			if err := kvFlags(&n, kvMem, kvDisk, kvMax); err != nil {
				return err
			}
			if n.KVPinQuota, err = parsePinQuota(kvPin); err != nil {
				return err
			}
			if err := checkKVSizes(kvstore.Config{DiskBytes: n.KVDisk, MaxValue: n.KVMaxValue}, "--kv-max-value"); err != nil {
				return err
			}
			unlock, err := dirlock.AcquireAll(n.Dir, n.KVDir)
			if err != nil {
				return fmt.Errorf("%w (another gd2fs server uses it: stop that one, or give this one another --disk / --kv-disk)", err)
			}
			defer unlock()
			ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			if c := s3.config(); c.Endpoint != "" || c.AccessKey != "" {
				n.Cold = &c
			}
			n.KVFlushOnClose = true // SIGTERM and Ctrl-C keep the DRAM-only KV blocks
			s, err := node.NewServer(n)
			if err != nil {
				return err
			}
			fmt.Fprintf(os.Stderr, "gd2fs server %s on %s (master %s)\n", s.ID(), s.Addr(), g.master)
			stopRESP, err := rf.start(ctx, g, s, n.KVMaxValue)
			if err != nil {
				s.Close()
				return err
			}
			defer stopRESP()
			return s.Run(ctx)
		},
	}
	f := cmd.Flags()
	f.StringVar(&listen, "listen", ":7071", "data-plane address (also serves /metrics over HTTP)")
	f.StringVar(&advertise, "advertise", "", "address clients dial (default: the listen address)")
	f.StringVar(&mem, "mem", "1GiB", "DRAM tier capacity (0 for none)")
	f.StringVar(&disk, "disk", "", "disk tier as DIR:SIZE, e.g. /nvme/gd2fs:2TiB")
	f.StringVar(&kvMem, "kv-mem", "1GiB", "KV cache DRAM tier (0 for none)")
	f.BoolVar(&prefault, "mem-prefault", false, "make the DRAM tiers (--mem, --kv-mem) resident in the background at start, so writes do not pay the first touch of each page (on VMs that trap it, half a server's CPU while its tiers fill); the memory is then in use from the start, not once the tiers are full")
	f.StringVar(&kvDisk, "kv-disk", "", "KV cache disk tier as DIR:SIZE, e.g. /nvme/gd2fs-kv:1TiB")
	f.StringVar(&kvMax, "kv-max-value", "64MiB", "largest KV value accepted")
	f.StringVar(&kvPolicy, "kv-policy", "auto", "KV DRAM tier policy: auto (S3-FIFO or LRU, whichever a sampled simulation of both finds better), s3fifo, lru")
	f.StringVar(&kvPin, "kv-pin-quota", "auto", "bytes of KV blocks that may be pinned in each KV tier (gd2fs kv pin): auto (a quarter of the tier), 0 (no pins) or a size such as 2GiB; at most half a tier")
	f.StringVar(&id, "id", "", "server id (default: kept in the disk tier, else random)")
	f.StringVar(&syncPolicy, "sync", "replicated", "writes made durable (fdatasync) before they are acknowledged: replicated (chunks of more than one replica: the ha pool), always, never (page cache only)")
	f.BoolVar(&debug, "debug-http", false, "serve /debug/pprof/ and /debug/gc on the server port")
	s3.add(f)
	f.IntVar(&maxConns, "max-conns", server.DefaultMaxConns, "most connections open at once on the port")
	f.IntVar(&maxPerIP, "max-conns-per-ip", server.DefaultMaxConnsPerIP, "most connections of one address that sent no hello yet (the first closed when the port is full; -1: no bound)")
	rf.add(f)
	f.DurationVar(&heartbeat, "heartbeat", time.Second, "heartbeat interval")
	f.DurationVar(&reconcile, "reconcile-every", server.DefaultReconcile, "how often to ask the master about chunks that appeared since the last time; one it records nowhere, held at least this long, is deleted (a copy a repair abandoned, a chunk a crashed master's window lost); negative: only at start")
	f.DurationVar(&forwardTimeout, "forward-timeout", server.DefaultForwardTimeout, "a replica that does not take a forwarded HA write within this (plus 1s per 8 MiB) fails the write (retryable); keep it below clients' --io-timeout")
	cmd.AddCommand(newServerDrain(g))
	return cmd
}

// dirSize parses DIR:SIZE.
func dirSize(flag, v string) (string, int64, error) {
	i := strings.LastIndexByte(v, ':')
	if i <= 0 {
		return "", 0, fmt.Errorf("--%s %q: write DIR:SIZE, e.g. /nvme/gd2fs:2TiB", flag, v)
	}
	n, err := parseSize(v[i+1:])
	return v[:i], n, err
}

// parsePinQuota reads --kv-pin-quota: "auto" is kvstore's default (0),
// "0" refuses pins (negative), else a size.
func parsePinQuota(v string) (int64, error) {
	switch v {
	case "auto", "":
		return 0, nil
	case "0", "off":
		return -1, nil
	}
	n, err := parseSize(v)
	if err != nil {
		return 0, fmt.Errorf("--kv-pin-quota %q: %w (write auto, 0 or a size such as 2GiB)", v, err)
	}
	return n, nil
}

// kvFlags reads the --kv-mem, --kv-disk and --kv-max-value flags into n.
func kvFlags(n *node.Server, mem, disk, maxValue string) error {
	var err error
	if n.KVMem, err = parseSize(mem); err != nil {
		return err
	}
	if n.KVMaxValue, err = parseSize(maxValue); err != nil {
		return err
	}
	if disk != "" {
		if n.KVDir, n.KVDisk, err = dirSize("kv-disk", disk); err != nil {
			return err
		}
	}
	return nil
}
