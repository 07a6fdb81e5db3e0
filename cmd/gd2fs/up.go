package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"github.com/gd2fs/gd2fs/internal/cluster"
	"github.com/gd2fs/gd2fs/internal/cold"
	"github.com/gd2fs/gd2fs/internal/dirlock"
	"github.com/gd2fs/gd2fs/internal/kvstore"
	"github.com/gd2fs/gd2fs/internal/meta"
	"github.com/gd2fs/gd2fs/internal/store"
	"github.com/spf13/cobra"
)

func newUp(g *globals) *cobra.Command {
	var dir, listen, mem, disk, kvMem, kvPolicy, kvPin, kvDisk, quota, cluster_, metaDSN, syncPolicy, durability, sessionMem string
	var servers, firstPort, respPort int
	var s3 s3Flags
	cmd := &cobra.Command{
		Use:   "up",
		Short: "Run a whole cluster on this machine: a master (SQLite) and several data servers",
		Example: `  gd2fs up                              # master on 127.0.0.1:7070, 3 servers, data in ./gd2fs-data
  gd2fs up --servers 5 --mem 1GiB --disk 20GiB --dir /var/lib/gd2fs
  gd2fs up --resp-port 16380                # Redis clients on 16380..16382 (0: none); redis-cli -p 16380 PING
  gd2fs up --listen 127.0.0.1:17070 --port 0 --resp-port 0   # servers on free ports: a second cluster beside the first
  gd2fs up --tls-cert node.pem --tls-key node-key.pem --tls-ca ca.pem --token-file ./token   # TLS (off by default on loopback)`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if servers < 1 {
				return usage(fmt.Errorf("--servers %d: a cluster needs at least one data server (gd2fs master runs a master alone)", servers))
			}
			memB, err := parseSize(mem)
			if err != nil {
				return err
			}
			diskB, err := parseSize(disk)
			if err != nil {
				return err
			}
			kvMemB, err := parseSize(kvMem)
			if err != nil {
				return err
			}
			kvDiskB, err := parseSize(kvDisk)
			if err != nil {
				return err
			}
			if err := checkKVSizes(kvstore.Config{DiskBytes: kvDiskB}, ""); err != nil {
				return err
			}
			q, err := parseSize(quota)
			if err != nil {
				return err
			}
			sm, err := parseSize(sessionMem)
			if err != nil {
				return fmt.Errorf("--session-memory: %w", err)
			}
			sp, err := store.ParseSyncPolicy(syncPolicy)
			if err != nil {
				return err
			}
			var addrs []string // none: every server on an ephemeral loopback port
			for i := 0; i < servers && firstPort > 0; i++ {
				addrs = append(addrs, "127.0.0.1:"+strconv.Itoa(firstPort+i))
			}
			var respAddrs []string
			for i := 0; i < servers && respPort > 0; i++ {
				respAddrs = append(respAddrs, "127.0.0.1:"+strconv.Itoa(respPort+i))
			}
			var cc *cold.Config
			if c := s3.config(); c.Endpoint != "" || c.AccessKey != "" {
				cc = &c
			}
			ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			abs, _ := filepath.Abs(dir)
			// The folder, and each server's tiers in it (internal/cluster's
			// layout), so that neither another up nor a gd2fs server given
			// one of them by hand shares them.
			lockDirs := []string{abs}
			for i := 0; i < servers; i++ {
				lockDirs = append(lockDirs, filepath.Join(abs, "server-"+strconv.Itoa(i)), filepath.Join(abs, "server-"+strconv.Itoa(i), "kv"))
			}
			pinQ, err := parsePinQuota(kvPin)
			if err != nil {
				return err
			}
			unlock, err := dirlock.AcquireAll(lockDirs...)
			if err != nil {
				return fmt.Errorf("%w (another gd2fs up uses this folder: stop it, or give this one another --dir)", err)
			}
			defer unlock()
			c, err := cluster.Start(ctx, cluster.Config{Dir: abs, MasterAddr: listen, ServerAddrs: addrs, Servers: servers,
				MemBytes: memB, DiskBytes: diskB, Sync: sp, KVMemBytes: kvMemB, KVPolicy: kvPolicy, KVPinQuota: pinQ, KVDiskBytes: kvDiskB, SessionQuota: q, SessionMemory: sm, SessionDurability: durability, Cold: cc, Token: g.token, Cluster: cluster_, Meta: metaDSN, Log: g.logger(),
				TLS: g.serverTLS, ClientTLS: g.clientTLS, RESP: respPort > 0, RESPAddrs: respAddrs, KVFlushOnClose: true})
			if err != nil {
				return fmt.Errorf("%w (is another gd2fs up running? stop it or pick other ports with --listen/--port/--resp-port)", err)
			}
			defer c.Close()
			fmt.Printf("gd2fs is up: master %s, %d servers (files: %s DRAM + %s disk; KV: %s DRAM + %s disk each), data in %s\n",
				c.Master.URL(), servers, human(memB), human(diskB), human(kvMemB), human(kvDiskB), abs)
			for i, s := range c.Servers {
				scheme := "http"
				if g.serverTLS != nil {
					scheme = "https"
				}
				fmt.Printf("  server %s at %s (metrics: %s://%s/metrics)", s.ID(), s.Addr(), scheme, s.Addr())
				if i < len(c.RESP) {
					fmt.Printf(", Redis protocol at %s", c.RESP[i].Addr())
				}
				fmt.Println()
			}
			fmt.Printf("\nConnect:\n  export GD2FS_MASTER=%s\n%s  gd2fs cp ./file gd2fs://%s/path/file\n  gd2fs status\n  web console: %s/ui/%s\nStop with Ctrl-C.\n",
				c.Master.URL(), connectAuth(g), clusterName(cluster_), c.Master.URL(), consoleLogin(g))
			<-ctx.Done()
			fmt.Println("gd2fs: shutting down")
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&dir, "dir", "./gd2fs-data", "data directory (metadata and server disk tiers)")
	f.StringVar(&listen, "listen", "127.0.0.1:7070", "master address")
	f.IntVar(&firstPort, "port", 7071, "first data server port; server i listens on port+i (0: ephemeral ports, printed at start)")
	f.IntVar(&servers, "servers", 3, "number of data servers")
	f.IntVar(&respPort, "resp-port", 6380, "first Redis-protocol port; server i's is resp-port+i (0: no Redis protocol)")
	f.StringVar(&mem, "mem", "256MiB", "DRAM tier per server")
	f.StringVar(&disk, "disk", "8GiB", "disk tier per server")
	f.StringVar(&syncPolicy, "sync", "replicated", "writes the servers make durable (fdatasync) before acknowledging: replicated (the ha pool), always, never")
	f.StringVar(&kvMem, "kv-mem", "256MiB", "KV cache DRAM tier per server")
	f.StringVar(&kvPolicy, "kv-policy", "auto", "KV DRAM tier policy: auto, s3fifo or lru (see gd2fs server --help)")
	f.StringVar(&kvDisk, "kv-disk", "4GiB", "KV cache disk tier per server")
	f.StringVar(&kvPin, "kv-pin-quota", "auto", "bytes of KV blocks that may be pinned per KV tier: auto (a quarter), 0 (no pins) or a size (see gd2fs server --help)")
	f.StringVar(&sessionMem, "session-memory", "0", sessionMemoryHelp)
	f.StringVar(&quota, "session-quota", "4GiB", "bytes of explicit-mode KV session files before LRU eviction, which then frees down to 1/32 below it")
	f.StringVar(&durability, "session-durability", meta.DurabilityFlush, durabilityHelp)
	s3.add(f)
	f.StringVar(&cluster_, "cluster", "local", "cluster name used in gd2fs://<cluster>/ URIs")
	f.StringVar(&metaDSN, "meta", "", "metadata store (default sqlite://<dir>/meta.db)")
	return cmd
}

func clusterName(s string) string {
	if s == "" {
		return "local"
	}
	return s
}

// connectAuth is what a client needs besides the master, for up's Connect
// block: the token (by file, never its value) and the TLS files.
func connectAuth(g *globals) string {
	var b strings.Builder
	switch {
	case g.tokenFile != "":
		abs, _ := filepath.Abs(g.tokenFile)
		fmt.Fprintf(&b, "  export GD2FS_TOKEN_FILE=%s   # every client needs the cluster token\n", abs)
	case g.token != "":
		b.WriteString("  export GD2FS_TOKEN_FILE=<a file holding the cluster token>   # every client needs it\n")
	}
	if g.tls.CA != "" {
		abs, _ := filepath.Abs(g.tls.CA)
		fmt.Fprintf(&b, "  export GD2FS_TLS_CA=%s\n", abs)
	}
	if g.tls.VerifyClients {
		b.WriteString("  export GD2FS_TLS_CERT=<client cert> GD2FS_TLS_KEY=<its key>   # the cluster verifies clients\n")
	}
	return b.String()
}

func consoleLogin(g *globals) string {
	if g.token == "" {
		return " (no token: no login)"
	}
	return " (log in with the cluster token)"
}
