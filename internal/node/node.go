// Package node is the composition root of gd2fs processes: a data server and
// a master are described here as an operator describes them (tier sizes and
// directories, the master, the token, TLS) and built from that description
// in one place, by `gd2fs server`, `gd2fs master`, `gd2fs up` and the
// in-process cluster of the tests (internal/cluster), and so by the chaos
// harness, whose servers are `gd2fs server` processes.
//
// A data server is: a chunk store (DRAM tier, disk tier), a KV store (DRAM
// tier, disk segments), an optional cold source (S3), the data plane to
// its peers (a client.PeerTransport: forwards, chunk and KV copies), all
// wired by server.New from the server.Config built here. A master is: a
// metadata store (SQLite or PostgreSQL) and the data plane to the servers
// (probes, repair copies) under master.New.
//
// The data plane: a client.PeerTransport given here as Transport carries
// every hop a server or a master starts (nil: TCP); clients pick theirs in
// client.Config.Transport. So a transport implementing both (RDMA,
// GPU-direct) carries every data hop of the cluster.
package node

import (
	"context"
	"crypto/tls"
	"fmt"
	"log/slog"
	"time"

	"github.com/gd2fs/gd2fs/client"
	"github.com/gd2fs/gd2fs/internal/cold"
	"github.com/gd2fs/gd2fs/internal/kvstore"
	"github.com/gd2fs/gd2fs/internal/master"
	"github.com/gd2fs/gd2fs/internal/meta"
	"github.com/gd2fs/gd2fs/internal/server"
	"github.com/gd2fs/gd2fs/internal/store"
)

// Server describes a data server.
type Server struct {
	ID        string // "": kept in <Dir>/server.id, else random
	Listen    string
	Advertise string // "": the listen address
	Master    string // master URL(s), comma-separated; "": standalone
	Token     string

	Mem  int64            // DRAM tier of file chunks (0: none)
	Dir  string           // disk tier of file chunks ("": none)
	Disk int64            // its size
	Sync store.SyncPolicy // which writes are synced before they are acknowledged

	// Prefault makes both DRAM tiers resident in the background at start
	// (store.Config.Prefault), not as writes first touch them.
	Prefault bool

	KVMem      int64  // KV DRAM tier (0: none)
	KVDir      string // KV disk tier ("": none)
	KVDisk     int64  // its size
	KVMaxValue int64  // largest KV value (0: limits.MaxKVValue)
	KVPolicy   string // KV DRAM policy ("": auto)
	KVPinQuota int64  // bytes pins may hold per KV tier (kvstore.Config.PinQuota: 0 a quarter, negative none)
	KVMoveRate int64  // server.Config.KVMoveRate (0: the default)
	// KVFlushOnClose: a graceful stop writes DRAM-only KV blocks to the KV
	// disk tier (server.Config.KVFlushOnClose).
	KVFlushOnClose bool

	Cold *cold.Config // S3 for linked files (nil: none)

	Heartbeat      time.Duration // 0: 1s
	Reconcile      time.Duration // 0: server.DefaultReconcile; negative: at start only
	ForwardTimeout time.Duration // 0: server.DefaultForwardTimeout
	MaxConns       int           // 0: server.DefaultMaxConns
	MaxConnsPerIP  int           // before the hello (0: server.DefaultMaxConnsPerIP; negative: no bound)
	Debug          bool          // /debug/pprof/ and /debug/gc on the port
	Log            *slog.Logger
	TLS, ClientTLS *tls.Config
	// Transport carries the server's hops to other servers (nil: TCP with
	// Token and ClientTLS); the server closes it.
	Transport client.PeerTransport
}

// Config is the server's configuration: the one place its tiers are set up
// from a description.
func (n Server) Config() server.Config {
	return server.Config{ID: n.ID, Listen: n.Listen, Advertise: n.Advertise, Master: n.Master, Token: n.Token,
		Store: store.Config{MemBytes: n.Mem, Dir: n.Dir, DiskBytes: n.Disk, Sync: n.Sync, Prefault: n.Prefault},
		KV:    kvstore.Config{MemBytes: n.KVMem, Dir: n.KVDir, DiskBytes: n.KVDisk, MaxValue: n.KVMaxValue, Policy: n.KVPolicy, PinQuota: n.KVPinQuota, Prefault: n.Prefault},
		Cold:  n.Cold, Heartbeat: n.Heartbeat, Reconcile: n.Reconcile, ForwardTimeout: n.ForwardTimeout, MaxConns: n.MaxConns, MaxConnsPerIP: n.MaxConnsPerIP, Debug: n.Debug, KVFlushOnClose: n.KVFlushOnClose, KVMoveRate: n.KVMoveRate,
		Log: n.Log, TLS: n.TLS, ClientTLS: n.ClientTLS, Peers: n.Transport}
}

// NewServer builds the data server n describes and starts listening; Run
// serves. What it opened is closed again when it fails.
func NewServer(n Server) (*server.Server, error) { return server.New(n.Config()) }

// Master describes a master.
type Master struct {
	Listen        string
	Advertise     string   // URL others reach it at ("": from Listen)
	PublicMasters []string // host:port of every master, for engine plans
	Meta          string   // metadata store: sqlite:///path/meta.db or postgres://...
	Cluster       string   // name in gd2fs://<cluster>/ URIs ("": local)
	Token         string

	DownAfter, RepairAfter, LeadWarmup time.Duration // 0: the master's defaults
	UnsealedTTL                        time.Duration // 0: the master's default (24h); negative: never
	SessionQuota                       int64         // bytes of session files (0: no limit)
	SessionMemory                      int64         // bytes of sessions the leader keeps in memory (0: no bound)
	NoPlanWarm                         bool          // master.Config.NoPlanWarm
	// SessionDurability: when the leader answers session plans and
	// commits, meta.DurabilityFlush (""), DurabilityWindow or DurabilitySync.
	SessionDurability string

	MaxConns       int      // 0: master.DefaultMaxConns
	MaxConnsPerIP  int      // before authenticating (0: master.DefaultMaxConnsPerIP; negative: no bound)
	AllowedHosts   []string // Host names a master without a token answers besides its own
	Log            *slog.Logger
	TLS, ClientTLS *tls.Config
	// Transport carries the master's probes and repair copies to the
	// servers (nil: TCP with Token and ClientTLS); the master closes it.
	Transport client.PeerTransport
}

// NewMaster opens the metadata store n names and the master on it. The
// caller closes both: the master first, then the store. When it fails,
// nothing is left open.
func NewMaster(ctx context.Context, n Master) (*master.Master, meta.Store, error) {
	ms, err := meta.Open(ctx, n.Meta)
	if err != nil {
		return nil, nil, err
	}
	if d, ok := ms.(meta.DurabilitySetter); ok && n.SessionDurability != "" {
		if err := d.SetSessionDurability(n.SessionDurability); err != nil {
			ms.Close()
			return nil, nil, fmt.Errorf("--session-durability: %w", err)
		}
	}
	if d, ok := ms.(meta.SessionMemorySetter); ok && n.SessionMemory != 0 {
		if err := d.SetSessionMemory(n.SessionMemory); err != nil {
			ms.Close()
			return nil, nil, fmt.Errorf("--session-memory: %w", err)
		}
	}
	cfg := master.Config{Listen: n.Listen, Meta: ms, Cluster: n.Cluster, Token: n.Token,
		DownAfter: n.DownAfter, RepairAfter: n.RepairAfter, LeadWarmup: n.LeadWarmup, UnsealedTTL: n.UnsealedTTL, SessionQuota: n.SessionQuota,
		Advertise: n.Advertise, PublicMasters: n.PublicMasters, Log: n.Log, TLS: n.TLS, ClientTLS: n.ClientTLS, MaxConns: n.MaxConns, MaxConnsPerIP: n.MaxConnsPerIP, AllowedHosts: n.AllowedHosts, NoPlanWarm: n.NoPlanWarm}
	if n.Transport != nil {
		cfg.Peers = n.Transport // not a nil client.PeerTransport in a master.Peers
	}
	m, err := master.New(ctx, cfg)
	if err != nil {
		ms.Close()
		return nil, nil, err
	}
	return m, ms, nil
}
