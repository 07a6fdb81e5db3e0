// Package cluster runs a whole gd2fs cluster in one process: a master on
// SQLite and several data servers on loopback. It is what `gd2fs up` runs and
// what tests use for a real cluster on real sockets.
package cluster

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/gd2fs/gd2fs/client"
	"github.com/gd2fs/gd2fs/internal/cold"
	"github.com/gd2fs/gd2fs/internal/master"
	"github.com/gd2fs/gd2fs/internal/meta"
	"github.com/gd2fs/gd2fs/internal/node"
	"github.com/gd2fs/gd2fs/internal/resp"
	"github.com/gd2fs/gd2fs/internal/server"
	"github.com/gd2fs/gd2fs/internal/store"
)

// Config describes a local cluster.
type Config struct {
	Dir         string // data root: meta.db and one folder per server
	MasterAddr  string // default 127.0.0.1:0
	ServerAddrs []string
	Servers     int   // default 3
	MemBytes    int64 // DRAM tier per server
	DiskBytes   int64 // disk tier per server; 0 = DRAM only
	// Prefault makes the servers' DRAM tiers resident at start
	// (node.Server.Prefault); benchmarks wait for Server.Prefaulted.
	Prefault bool
	// Sync is the servers' write durability policy (store.SyncPolicy).
	Sync         store.SyncPolicy
	KVMemBytes   int64  // KV DRAM tier per server; 0 = none
	KVPolicy     string // kvstore.Config.Policy ("" = auto)
	KVPinQuota   int64  // kvstore.Config.PinQuota (0: a quarter of each tier)
	KVMoveRate   int64  // server.Config.KVMoveRate (0: the default; 1: tests that need blocks left where they were)
	RESPPrefetch string // what the RESP doors' EXISTS prefetches (resp.Server.SetPrefetch; "": off)
	KVDiskBytes  int64  // KV disk tier per server (under <Dir>/server-<i>/kv); 0 = none
	Meta         string
	Token        string
	Cluster      string
	DownAfter    time.Duration
	Reconcile    time.Duration // servers' server.Config.Reconcile (0: its default)
	RepairAfter  time.Duration
	// Cold is the S3 endpoint servers fill linked files from (nil: none).
	Cold *cold.Config
	// SessionQuota bounds explicit-mode KV session files (0: no limit).
	SessionQuota int64
	// SessionDurability: node.Master's ("": flush).
	SessionDurability string
	// SessionMemory: node.Master's (0: no bound).
	SessionMemory int64
	// RESP starts a Redis-protocol front end beside every server (on
	// RESPAddrs[i], default an ephemeral loopback port): see resp.go.
	RESP      bool
	RESPAddrs []string
	Log       *slog.Logger
	// TLS serves the master and the servers over TLS; ClientTLS is what
	// servers, the master and Client() dial with (docs/security.md).
	TLS, ClientTLS *tls.Config
	// MaxConns bounds connections per listener (0: the defaults).
	MaxConns int
	// KVFlushOnClose: servers write DRAM-only KV blocks to their disk tier
	// when closed (server.Config.KVFlushOnClose).
	KVFlushOnClose bool
	// Transport, when set, makes the data plane of the master and of each
	// server (node.Server.Transport, node.Master.Transport); nil: TCP.
	Transport func() client.PeerTransport
}

// Cluster is a running local cluster.
type Cluster struct {
	Master  *master.Master
	Servers []*server.Server
	RESP    []*resp.Server // with Config.RESP: RESP[i] fronts Servers[i]
	Meta    meta.Store
	cfg     Config
	cancel  context.CancelFunc
	done    chan struct{}
}

// Start starts a master and cfg.Servers servers and waits until every server
// has registered.
func Start(ctx context.Context, cfg Config) (*Cluster, error) {
	if cfg.Servers <= 0 {
		cfg.Servers = 3
	}
	if cfg.MasterAddr == "" {
		cfg.MasterAddr = "127.0.0.1:0"
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	if err := os.MkdirAll(cfg.Dir, 0o700); err != nil {
		return nil, fmt.Errorf("create data dir %s: %w", cfg.Dir, err)
	}
	if cfg.Meta == "" {
		cfg.Meta = "sqlite://" + filepath.Join(cfg.Dir, "meta.db")
	}
	mn := node.Master{Listen: cfg.MasterAddr, Meta: cfg.Meta, Cluster: cfg.Cluster, Token: cfg.Token,
		DownAfter: cfg.DownAfter, RepairAfter: cfg.RepairAfter, SessionQuota: cfg.SessionQuota, SessionMemory: cfg.SessionMemory, SessionDurability: cfg.SessionDurability, Log: cfg.Log,
		TLS: cfg.TLS, ClientTLS: cfg.ClientTLS, MaxConns: cfg.MaxConns}
	if cfg.Transport != nil {
		mn.Transport = cfg.Transport()
	}
	m, ms, err := node.NewMaster(ctx, mn)
	if err != nil {
		return nil, err
	}
	rctx, cancel := context.WithCancel(context.Background())
	c := &Cluster{Master: m, Meta: ms, cfg: cfg, cancel: cancel, done: make(chan struct{})}
	go func() { m.Run(rctx); close(c.done) }()
	for i := 0; i < cfg.Servers; i++ {
		if _, err := c.AddServer(i); err != nil {
			c.Close()
			return nil, err
		}
	}
	if err := c.WaitServers(ctx, cfg.Servers); err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}

// AddServer starts server number i (its folder is <Dir>/server-<i>).
func (c *Cluster) AddServer(i int) (*server.Server, error) {
	addr := "127.0.0.1:0"
	if i < len(c.cfg.ServerAddrs) {
		addr = c.cfg.ServerAddrs[i]
	}
	n := node.Server{ID: "server-" + strconv.Itoa(i), Listen: addr, Master: c.Master.URL(), Token: c.cfg.Token,
		Mem: c.cfg.MemBytes, Prefault: c.cfg.Prefault, Sync: c.cfg.Sync, KVMem: c.cfg.KVMemBytes, KVPolicy: c.cfg.KVPolicy, KVPinQuota: c.cfg.KVPinQuota, KVMoveRate: c.cfg.KVMoveRate, Cold: c.cfg.Cold,
		Heartbeat: c.heartbeat(), Reconcile: c.cfg.Reconcile, Log: c.cfg.Log, TLS: c.cfg.TLS, ClientTLS: c.cfg.ClientTLS, MaxConns: c.cfg.MaxConns}
	if c.cfg.DiskBytes > 0 {
		n.Dir, n.Disk = filepath.Join(c.cfg.Dir, "server-"+strconv.Itoa(i)), c.cfg.DiskBytes
	}
	if c.cfg.KVDiskBytes > 0 {
		n.KVDir, n.KVDisk = filepath.Join(c.cfg.Dir, "server-"+strconv.Itoa(i), "kv"), c.cfg.KVDiskBytes
	}
	n.KVFlushOnClose = c.cfg.KVFlushOnClose
	if c.cfg.Transport != nil {
		n.Transport = c.cfg.Transport()
	}
	s, err := node.NewServer(n)
	if err != nil {
		return nil, err
	}
	go s.Run(context.Background())
	if err := c.addRESP(i, s); err != nil {
		s.Close()
		return nil, err
	}
	if i < len(c.Servers) {
		c.Servers[i] = s
	} else {
		c.Servers = append(c.Servers, s)
	}
	return s, nil
}

func (c *Cluster) heartbeat() time.Duration {
	if c.cfg.DownAfter > 0 {
		return c.cfg.DownAfter / 5
	}
	return time.Second
}

// WaitServers waits until n servers are up at the master.
func (c *Cluster) WaitServers(ctx context.Context, n int) error {
	cl := c.Client()
	defer cl.Close()
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	for {
		st, err := cl.Status(ctx)
		if err == nil {
			up := 0
			for _, s := range st.Servers {
				if s.State == "up" {
					up++
				}
			}
			if up >= n {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return errors.New("cluster: servers did not register with the master within 30s")
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// Client returns a client for the cluster.
func (c *Cluster) Client() *client.Client {
	cl, _ := client.New(client.Config{Master: c.Master.URL(), Token: c.cfg.Token, TLS: c.cfg.ClientTLS})
	return cl
}

// Close stops everything.
func (c *Cluster) Close() error {
	c.closeRESP()
	for _, s := range c.Servers {
		if s != nil {
			s.Close()
		}
	}
	c.cancel()
	c.Master.Close()
	<-c.done
	return c.Meta.Close()
}
