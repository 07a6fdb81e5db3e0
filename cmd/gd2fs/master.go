package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/gd2fs/gd2fs/internal/master"
	"github.com/gd2fs/gd2fs/internal/meta"
	"github.com/gd2fs/gd2fs/internal/node"
	"github.com/spf13/cobra"
)

func newMaster(g *globals) *cobra.Command {
	var listen, metaDSN, clusterN, quota, advertise, durability, sessionMem string
	var publicMasters, allowHosts []string
	var downAfter, repairAfter, leadWarmup, unsealedTTL time.Duration
	var maxConns, maxPerIP int
	var planWarm bool
	cmd := &cobra.Command{
		Use:   "master",
		Short: "Run the master: namespace, placement, membership (metadata in SQLite or PostgreSQL)",
		Long:  "Run the master: namespace, placement, membership (metadata in SQLite or PostgreSQL).\n\n" + masterGCHelp,
		Example: `  gd2fs master --listen :7070 --meta sqlite:///var/lib/gd2fs/meta.db
  gd2fs master --unsealed-ttl 2h     # remove files whose writer died after 2 hours, not 24
  # several masters on one PostgreSQL database: one leads, the others stand by
  gd2fs master --listen :7070 --advertise http://m1:7070 --meta postgres://gd2fs@db:5432/gd2fs --token "$TOKEN"
  gd2fs master --listen :7070 --advertise http://m2:7070 --meta postgres://gd2fs@db:5432/gd2fs --token "$TOKEN"
  gd2fs server --master http://m1:7070,http://m2:7070 ...
  # answer chat turns' plans and commits at once, writing them to SQL just behind
  # (a crash loses about the last flush's turns: shorter sessions, never wrong KV)
  gd2fs master --meta sqlite:///var/lib/gd2fs/meta.db --session-durability window
  # TLS with client certificates, the token from a file (not visible in ps)
  gd2fs master --tls-cert m.pem --tls-key m-key.pem --tls-ca ca.pem --tls-verify-clients --token-file /etc/gd2fs/token
  # a leader with millions of sessions keeps about 2 GiB of them in memory (the rest plan from SQL)
  gd2fs master --meta postgres://gd2fs@db:5432/gd2fs --session-memory 2GiB
  # plans do not ask servers to bring their stored ranges into DRAM
  gd2fs master --listen :7070 --plan-warm=false`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			cg, _ := os.ReadFile("/proc/self/cgroup") // none (not Linux): no cgroup limit to follow
			tuneMasterGC(g.logger(), "/sys/fs/cgroup", cg)
			q, err := parseSize(quota)
			if err != nil {
				return err
			}
			sm, err := parseSize(sessionMem)
			if err != nil {
				return fmt.Errorf("--session-memory: %w", err)
			}
			m, ms, err := node.NewMaster(ctx, node.Master{Listen: listen, Meta: metaDSN, Cluster: clusterN, Token: g.token,
				DownAfter: downAfter, RepairAfter: repairAfter, LeadWarmup: leadWarmup, UnsealedTTL: unsealedTTL, SessionQuota: q, SessionMemory: sm, SessionDurability: durability, Advertise: advertise, PublicMasters: publicMasters, Log: g.logger(),
				TLS: g.serverTLS, ClientTLS: g.clientTLS, MaxConns: maxConns, MaxConnsPerIP: maxPerIP, AllowedHosts: allowHosts, NoPlanWarm: !planWarm})
			if err != nil {
				return err
			}
			defer ms.Close()
			role := "leading"
			if !m.Leader() {
				role = "standby: another master leads; this one takes over if it goes"
			}
			fmt.Fprintf(os.Stderr, "gd2fs master on %s (cluster %q, metadata %s, %s)\n", m.URL(), clusterN, redactDSN(metaDSN), role)
			return m.Run(ctx)
		},
	}
	f := cmd.Flags()
	f.StringVar(&listen, "listen", ":7070", "HTTP address")
	f.StringVar(&metaDSN, "meta", envOr("GD2FS_META", "sqlite://./gd2fs-meta.db"), "metadata store: sqlite:///path/meta.db or postgres://... (env GD2FS_META: keeps a PostgreSQL password out of ps)")
	f.StringVar(&clusterN, "cluster", "local", "cluster name used in gd2fs://<cluster>/ URIs")
	f.StringVar(&advertise, "advertise", "", "URL others reach this master at (default: from --listen)")
	f.StringSliceVar(&publicMasters, "public-masters", nil, "host:port of every master, named in the kv_uris of vllm-format plans (default: from --advertise)")
	f.StringVar(&quota, "session-quota", "0", "bytes of explicit-mode KV session files before LRU eviction, which then frees down to 1/32 below it (0: no limit)")
	f.StringVar(&durability, "session-durability", meta.DurabilityFlush, durabilityHelp)
	f.StringVar(&sessionMem, "session-memory", "0", sessionMemoryHelp)
	f.IntVar(&maxConns, "max-conns", master.DefaultMaxConns, "most HTTP connections open at once")
	f.IntVar(&maxPerIP, "max-conns-per-ip", master.DefaultMaxConnsPerIP, "most connections of one address that made no authenticated request yet (the first closed when the port is full; -1: no bound)")
	f.StringSliceVar(&allowHosts, "allow-host", nil, "a DNS name clients reach this master by; without a token a master answers only IP addresses, localhost, its own and these names (against DNS rebinding)")
	f.DurationVar(&downAfter, "down-after", 5*time.Second, "mark a server down after this long without a heartbeat")
	f.DurationVar(&repairAfter, "repair-after", 30*time.Second, "re-replicate HA chunks of a server down this long (negative: never)")
	f.BoolVar(&planWarm, "plan-warm", true, "after each explicit-mode plan, ask the servers holding its stored ranges (those with a disk tier) to copy them into DRAM (asynchronous, bounded, never pinned)")
	f.DurationVar(&unsealedTTL, "unsealed-ttl", master.DefaultUnsealedTTL, "remove a file left unsealed this long without a write (its writer died: kill -9, a lost host); negative: never")
	f.DurationVar(&leadWarmup, "lead-warmup", 2*time.Second, "on taking over leadership, wait at most this long for the servers' heartbeats before placing chunks or declaring servers down (clients are told to retry meanwhile; at least the servers' --heartbeat)")
	return cmd
}

// sessionMemoryHelp is --session-memory's help, on master and up.
const sessionMemoryHelp = "bytes of explicit-mode sessions the leader keeps in memory (estimated: about 3 KiB a session of a 1,000-token prompt); past it the least recently used are dropped from memory only, and their next plan runs in SQL, which loads them back (0: no bound, every session served stays in memory); docs/kv-cache.md"

// durabilityHelp is --session-durability's help, on master and up.
const durabilityHelp = "when the leader answers explicit-mode session plans and commits, and Syncs of session files (an engine's saved KV): flush (after the SQL transaction that writes them, shared by all that arrived meanwhile: nothing acknowledged is lost), window (at once, written to SQL 20 ms after the previous write began, sooner when a read or an operation in SQL needs it; a crash or failover loses what was answered since the last flush that committed, about two flushes and at most about 2,048 operations: those sessions read shorter, never wrong KV) or sync (each in the group transaction, no write-behind); docs/kv-cache.md"

// redactDSN names the metadata engine without a PostgreSQL DSN's password.
func redactDSN(d string) string {
	if strings.HasPrefix(d, "postgres://") || strings.HasPrefix(d, "postgresql://") {
		return "PostgreSQL"
	}
	return d
}
