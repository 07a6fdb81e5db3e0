// Package master is the gd2fs master: namespace, placement, pools and
// membership, served as HTTP/JSON (docs/api.md). It holds metadata only and is
// never on the data path. State lives in a meta.Store, so a restart loses
// nothing; server liveness is soft state rebuilt from heartbeats.
package master

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gd2fs/gd2fs/internal/api"
	"github.com/gd2fs/gd2fs/internal/console"
	"github.com/gd2fs/gd2fs/internal/frames"
	"github.com/gd2fs/gd2fs/internal/meta"
	"github.com/gd2fs/gd2fs/internal/netguard"
	"github.com/gd2fs/gd2fs/internal/tcp"
)

// Config configures a master.
type Config struct {
	Listen    string
	Meta      meta.Store
	Cluster   string        // name in gd2fs://<cluster>/path URIs; default "local"
	Token     string        // cluster token; "" accepts any caller
	DownAfter time.Duration // a server silent this long is down (default 5s)
	// RepairAfter: HA chunks on a server down this long are copied to
	// another server (default 30s). Negative disables repair.
	RepairAfter time.Duration
	// UnsealedTTL: an unsealed file nothing has written for this long
	// (no create, chunk allocation or commit: its writer died) is removed
	// (default 24h; negative: never). unsealed.go.
	UnsealedTTL time.Duration
	// LeadWarmup: a master that takes over leadership waits this long at
	// most for the known servers' heartbeats before it places chunks or
	// declares a silent server down (default 2s: two of the servers'
	// default heartbeat intervals). Meanwhile placement answers "retry"
	// (503 with Retry-After) and clients wait; it ends early once every
	// known server has reported.
	LeadWarmup time.Duration
	// SessionQuota bounds the bytes of explicit-mode KV session files; past
	// it the least recently used idle sessions are evicted. 0: no limit.
	SessionQuota int64
	SessionPool  string // pool of session files (default perf)
	Log          *slog.Logger
	// Advertise is the URL other masters and clients are told to use for
	// this master when it leads (default: its listen address).
	Advertise string
	// PublicMasters are the host:port of every master, named in the
	// kv_uris of engine-format plans (default: this master's Advertise).
	PublicMasters []string
	// MaxConns bounds open HTTP connections (default 4096). ReadTimeout
	// bounds reading a request's headers and body (default 60s; headers
	// alone: 10s), IdleTimeout a keep-alive connection between requests
	// (default 2m). http.go has the rest.
	MaxConns                 int
	ReadTimeout, IdleTimeout time.Duration
	// MaxConnsPerIP bounds one address's connections that have not
	// authenticated yet (default 512; negative: no bound). Such
	// connections are the first closed when MaxConns are open (guard.go).
	MaxConnsPerIP int
	// TLS, when set, serves the API over HTTPS only. ClientTLS is how the
	// master dials data servers (repair copies); nil: plain TCP.
	TLS, ClientTLS *tls.Config
	// AllowedHosts are names (Host headers) a master without a token
	// answers besides IP addresses, localhost and its own names (guard.go).
	AllowedHosts []string
	// Peers carries the master's hops to data servers (probes of what
	// they hold, repair copies); nil: TCP with Token and ClientTLS. The
	// master owns it: Close closes it. client.PeerTransport is one.
	Peers Peers
	// NoPlanWarm: plans do not ask servers to copy the chunks of their
	// stored ranges into DRAM (planwarm.go; on by default).
	NoPlanWarm bool
}

// Peers is what the master asks of the data plane: what a server holds
// of a chunk (StatChunk, ChunkExtents) and to copy one from another server
// (CopyChunk, repair), and to warm a plan's chunks (PrefetchChunk,
// planwarm.go). Its methods are client.PeerTransport's, so any data
// plane that carries the servers' hops carries the master's too.
type Peers interface {
	StatChunk(ctx context.Context, addr string, id uint64) (length int64, sealed bool, err error)
	ChunkExtents(ctx context.Context, addr string, id uint64, off, n int64) (ext []int64, length int64, sealed bool, err error)
	CopyChunk(ctx context.Context, addr string, id uint64, src string) error
	PrefetchChunk(ctx context.Context, addr string, id uint64) error
	Close()
}

// DefaultChunkSize is used when a create asks for none.
const DefaultChunkSize = 16 << 20

type liveServer struct {
	info     api.ServerInfo
	lastSeen time.Time
	up       bool
	downAt   time.Time
	// presumed: loaded from the store when this master took over and not
	// heard from yet. During the warm-up it counts as a member (as it was
	// under the old leader) but gets no new chunks; after it, it is down.
	presumed bool
}

// serving: up, and not reporting itself unable to accept connections. Only
// serving servers get new chunks, membership and the Up flag on replicas.
func (s *liveServer) serving() bool { return s.up && s.info.Unhealthy == "" }

// Master is a running master.
type Master struct {
	cfg   Config
	log   *slog.Logger
	meta  meta.Store
	ln    net.Listener
	guard *netguard.Listener
	// frames serves the framed connections upgraded from /v1/frames
	// (package frames): calls of explicit sessions without net/http's
	// per-request goroutines.
	frames  *frames.Server
	srv     *http.Server
	peers   Peers
	metrics *metrics
	// planHeld: the fresh chunks of recent plans, for their commits
	// (written.go); its own lock.
	planHeld planChunks
	// sessionPool: the session pool once looked up (sessions.go).
	sessionPool atomic.Pointer[meta.Pool]

	// sessions is the part of meta the explicit-mode handlers use.
	sessions meta.Sessions

	mu      sync.Mutex
	servers map[string]*liveServer
	epoch   int64
	kvHist  kvHistory // earlier member lists and draining servers (kvmembers.go)
	// kvSaveMu orders saves of kvHist (kvhistory.go); taken before mu.
	kvSaveMu sync.Mutex
	kvSave   kvSaver // saves kvHist in the background (kvhistory.go)

	// leader: this master holds leadership of its store (always, alone on
	// SQLite; one of several on PostgreSQL). A standby answers 503 with the
	// leader's address and takes over when the leader's lock goes.
	leader atomic.Bool
	url    string
	// warmUntil: while leading and before this, the master waits for
	// heartbeats (Config.LeadWarmup); guarded by mu. Zero when warm.
	warmUntil time.Time

	console *console.Console // web console at /ui/ (console.go)
	plans   planStats
	refills refiller     // linked chunks re-placed after failure (refill.go)
	warm    planWarmer   // plans' stored ranges copied into DRAM (planwarm.go)
	health  masterHealth // /readyz and the health metrics (health.go)
	// expiredAt: when the leader last looked for abandoned unsealed
	// files (unsealed.go); only the loop touches it.
	expiredAt time.Time
}

// New opens the master: it ensures the default pools exist and loads known
// servers (as down until they heartbeat).
func New(ctx context.Context, cfg Config) (*Master, error) {
	if cfg.Cluster == "" {
		cfg.Cluster = "local"
	}
	if cfg.DownAfter <= 0 {
		cfg.DownAfter = 5 * time.Second
	}
	if cfg.UnsealedTTL == 0 {
		cfg.UnsealedTTL = DefaultUnsealedTTL
	}
	if cfg.RepairAfter == 0 {
		cfg.RepairAfter = 30 * time.Second
	}
	if cfg.LeadWarmup == 0 {
		cfg.LeadWarmup = 2 * time.Second
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	if cfg.SessionPool == "" {
		cfg.SessionPool = "perf"
	}
	cfg.fillLimits()
	m := &Master{cfg: cfg, log: cfg.Log.With("role", "master"), meta: cfg.Meta, sessions: cfg.Meta, servers: map[string]*liveServer{},
		refills: refiller{probed: map[string]time.Time{}},
		peers:   cfg.Peers}
	if m.peers == nil {
		m.peers = tcp.NewPool(tcp.Options{Token: cfg.Token, Name: "master", Streams: 1, TLS: cfg.ClientTLS})
	}
	m.warm.off.Store(cfg.NoPlanWarm)
	pools, err := m.meta.Pools(ctx)
	if err != nil {
		return nil, err
	}
	if len(pools) == 0 {
		for _, p := range []meta.Pool{{Name: "ha", Replicas: 3}, {Name: "perf", Replicas: 1}} {
			if err := m.meta.PutPool(ctx, p); err != nil {
				return nil, err
			}
		}
	}
	// Frames carry only what clients send that way (api.Framed): every
	// other call keeps to plain HTTP, where a proxy in front can see it.
	// Takes tells clients that a file's commit (a Sync) and a session
	// file's stat may come framed: a master from before answered them 400
	// there.
	m.frames = &frames.Server{Allow: api.Framed, Takes: []string{frames.CallCommit, frames.CallStat}, Idle: cfg.IdleTimeout, Read: cfg.ReadTimeout, Write: WriteTimeout, Log: m.log}
	m.metrics = newMetrics(m)
	m.metrics.registerFrameMetrics(m.frames)
	m.registerHealthMetrics() // health.go
	m.console = m.newConsole()
	tl, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		return nil, fmt.Errorf("master: listen on %s: %w (is another master running?)", cfg.Listen, err)
	}
	m.guard = netguard.New(tl, cfg.MaxConns, m.log).Protect(max(cfg.MaxConnsPerIP, 0), PreAuthTimeout)
	m.ln = m.guard
	if cfg.TLS != nil {
		m.ln = tls.NewListener(m.guard, cfg.TLS)
	}
	m.url = cfg.Advertise
	if m.url == "" {
		m.url = m.URL()
	}
	if err := m.tryLead(ctx); err != nil {
		m.ln.Close()
		return nil, err
	}
	m.srv = newHTTPServer(m.Handler(), cfg)
	return m, nil
}

// URL is the master's base URL.
func (m *Master) URL() string {
	host, port, _ := net.SplitHostPort(m.ln.Addr().String())
	if ip := net.ParseIP(host); ip == nil || ip.IsUnspecified() {
		host = "127.0.0.1"
	}
	scheme := "http://"
	if m.cfg.TLS != nil {
		scheme = "https://"
	}
	return scheme + net.JoinHostPort(host, port)
}

// Run serves until ctx ends.
func (m *Master) Run(ctx context.Context) error {
	go m.loop(ctx)
	go m.console.Run(ctx)
	go func() { <-ctx.Done(); m.Close() }()
	if err := m.srv.Serve(m.ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

// Close stops the HTTP server. The meta store is the caller's to close.
func (m *Master) Close() error {
	m.closeWarm()
	m.kvSave.stop()
	m.peers.Close()
	err := m.srv.Close()
	m.frames.Close() // the server does not close connections it handed over
	return err
}

// ---- HTTP ----
