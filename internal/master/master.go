// Package master is the gd2fs master: namespace, placement, pools and
// membership, served as HTTP/JSON (docs/api.md). It holds metadata only and is
// never on the data path. State lives in a meta.Store, so a restart loses
// nothing; server liveness is soft state rebuilt from heartbeats.
package master

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net"
	"net/http"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gd2fs/gd2fs/errs"
	"github.com/gd2fs/gd2fs/internal/api"
	"github.com/gd2fs/gd2fs/internal/console"
	"github.com/gd2fs/gd2fs/internal/limits"
	"github.com/gd2fs/gd2fs/internal/meta"
	"github.com/gd2fs/gd2fs/internal/netguard"
	"github.com/gd2fs/gd2fs/internal/nspath"
	"github.com/gd2fs/gd2fs/internal/placement"
	"github.com/gd2fs/gd2fs/internal/rpc"
	"github.com/gd2fs/gd2fs/internal/store"
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
	// TLS, when set, serves the API over HTTPS only. ClientTLS is how the
	// master dials data servers (repair copies); nil: plain TCP.
	TLS, ClientTLS *tls.Config
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
	cfg     Config
	log     *slog.Logger
	meta    meta.Store
	ln      net.Listener
	guard   *netguard.Listener
	srv     *http.Server
	peers   *rpc.Pool
	metrics *metrics

	// sessions is the part of meta the explicit-mode handlers use.
	sessions meta.Sessions

	mu      sync.Mutex
	servers map[string]*liveServer
	epoch   int64

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
	refills refiller // linked chunks re-placed after failure (refill.go)
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
		peers:   rpc.NewPool(rpc.Options{Token: cfg.Token, Name: "master", Streams: 1, TLS: cfg.ClientTLS})}
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
	m.metrics = newMetrics(m)
	m.console = m.newConsole()
	tcp, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		return nil, fmt.Errorf("master: listen on %s: %w (is another master running?)", cfg.Listen, err)
	}
	m.guard = netguard.New(tcp, cfg.MaxConns, m.log)
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
	m.peers.Close()
	return m.srv.Close()
}

// loop marks silent servers down and repairs HA chunks of long-dead ones.
func (m *Master) loop(ctx context.Context) {
	t := time.NewTicker(m.cfg.DownAfter / 5)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if err := m.tryLead(ctx); err != nil {
			m.log.Warn("leadership check failed", "err", err)
		}
		if !m.leader.Load() {
			continue
		}
		if m.warming() {
			continue
		}
		m.checkLiveness(ctx)
		if m.cfg.RepairAfter > 0 {
			m.repair(ctx)
		}
	}
}

// tryLead takes leadership when it is free and notices when it was lost. A
// master that becomes leader reloads the servers and the epoch from the
// store, which the old leader kept current, and warms up: it waits for the
// servers' heartbeats (Config.LeadWarmup) before it places chunks or
// declares the silent ones down.
func (m *Master) tryLead(ctx context.Context) error {
	ok, err := m.meta.Lead(ctx, m.url)
	if err != nil {
		ok = false
	}
	was := m.leader.Load()
	switch {
	case ok && !was:
		svs, err := m.meta.Servers(ctx)
		if err != nil {
			return err
		}
		epoch, err := m.meta.BumpEpoch(ctx)
		if err != nil {
			return err
		}
		m.mu.Lock()
		m.servers = map[string]*liveServer{}
		now := time.Now()
		for _, s := range svs {
			m.servers[s.ID] = &liveServer{info: api.ServerInfo{ID: s.ID, Addr: s.Addr, MemCap: s.MemCap, DiskCap: s.DiskCap, State: "unknown"}, downAt: now, presumed: true}
		}
		m.epoch = epoch
		m.warmUntil = time.Time{}
		if len(svs) > 0 && m.cfg.LeadWarmup > 0 {
			m.warmUntil = now.Add(m.cfg.LeadWarmup)
		}
		m.mu.Unlock()
		m.leader.Store(true)
		m.log.Info("leading", "url", m.url, "epoch", epoch)
	case !ok && was:
		m.leader.Store(false)
		m.log.Warn("lost leadership: now a standby", "url", m.url)
	case !ok && !was:
		m.log.Debug("standby", "url", m.url)
	}
	return err
}

// Leader reports whether this master leads.
func (m *Master) Leader() bool { return m.leader.Load() }

// warming reports whether the master still waits for heartbeats after
// taking over; the first call after the warm-up declares the servers not
// heard from down.
func (m *Master) warming() bool {
	m.mu.Lock()
	if m.warmUntil.IsZero() {
		m.mu.Unlock()
		return false
	}
	now := time.Now()
	waiting := 0
	for _, s := range m.servers {
		if s.presumed {
			waiting++
		}
	}
	if waiting > 0 && now.Before(m.warmUntil) {
		m.mu.Unlock()
		return true
	}
	m.warmUntil = time.Time{}
	for _, s := range m.servers {
		if s.presumed {
			s.presumed, s.downAt, s.info.State = false, now, "down"
			m.log.Warn("server down: no heartbeat since this master took over", "id", s.info.ID, "addr", s.info.Addr)
		}
	}
	m.mu.Unlock()
	if waiting > 0 {
		m.bumpEpoch(context.Background())
	}
	return false
}

// errWarming is placement's answer during the warm-up.
func (m *Master) errWarming() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	heard := 0
	for _, s := range m.servers {
		if !s.presumed {
			heard++
		}
	}
	return errs.New(errs.ErrUnavailable, "master %s has just taken over and waits for the servers' heartbeats before placing chunks (%d of %d reported): %w",
		m.url, heard, len(m.servers), api.ErrRetryLater)
}

func (m *Master) checkLiveness(ctx context.Context) {
	now := time.Now()
	m.mu.Lock()
	changed := false
	for _, s := range m.servers {
		if s.up && now.Sub(s.lastSeen) > m.cfg.DownAfter {
			s.up, s.downAt, s.info.State = false, now, "down"
			changed = true
			m.log.Warn("server down: no heartbeat", "id", s.info.ID, "addr", s.info.Addr, "silent", now.Sub(s.lastSeen).Round(time.Millisecond))
		}
	}
	m.mu.Unlock()
	if changed {
		m.bumpEpoch(ctx)
	}
}

func (m *Master) bumpEpoch(ctx context.Context) {
	e, err := m.meta.BumpEpoch(ctx)
	if err != nil {
		m.log.Error("bump epoch", "err", err)
		return
	}
	m.mu.Lock()
	m.epoch = e
	m.mu.Unlock()
}

// heartbeat records a server's report and answers with the epoch and the
// chunks it must delete.
func (m *Master) heartbeat(ctx context.Context, hb api.Heartbeat) (api.HeartbeatReply, error) {
	if hb.ID == "" || hb.Addr == "" {
		return api.HeartbeatReply{}, errs.New(errs.ErrBadRequest, "heartbeat needs id and addr")
	}
	if len(hb.Deleted) > 0 {
		if err := m.meta.ClearTombstones(ctx, hb.ID, hb.Deleted); err != nil {
			return api.HeartbeatReply{}, err
		}
	}
	reconciled := false
	if hb.Held != nil {
		n, err := m.meta.Orphans(ctx, hb.ID, hb.Held)
		if err != nil {
			return api.HeartbeatReply{}, err
		}
		if n > 0 {
			m.log.Info("server holds chunks no file uses; deleting them", "id", hb.ID, "chunks", n)
		}
		reconciled = true
	}
	m.mu.Lock()
	s := m.servers[hb.ID]
	isNew := s == nil || (!s.up && !s.presumed) || s.info.Addr != hb.Addr || s.info.MemCap != hb.MemCap || s.info.DiskCap != hb.DiskCap
	healthChanged := s != nil && s.up && (s.info.Unhealthy == "") != (hb.Unhealthy == "")
	if s == nil {
		s = &liveServer{}
		m.servers[hb.ID] = s
	}
	s.info = hb.ServerInfo
	s.info.State = "up"
	if hb.Unhealthy != "" {
		s.info.State = "unhealthy"
	}
	s.lastSeen = time.Now()
	s.info.LastSeen = s.lastSeen
	s.up = true
	s.presumed = false
	m.mu.Unlock()
	if isNew {
		if err := m.meta.PutServer(ctx, meta.Server{ID: hb.ID, Addr: hb.Addr, MemCap: hb.MemCap, DiskCap: hb.DiskCap}); err != nil {
			return api.HeartbeatReply{}, err
		}
		m.log.Info("server up", "id", hb.ID, "addr", hb.Addr)
		m.bumpEpoch(ctx)
	} else if healthChanged {
		if hb.Unhealthy != "" {
			m.log.Warn("server unhealthy: left out of placement and membership", "id", hb.ID, "reason", hb.Unhealthy)
		} else {
			m.log.Info("server healthy again", "id", hb.ID)
		}
		m.bumpEpoch(ctx)
	}
	del, err := m.meta.Tombstones(ctx, hb.ID, 512)
	if err != nil {
		return api.HeartbeatReply{}, err
	}
	ms, err := m.membership(ctx)
	return api.HeartbeatReply{Membership: ms, Delete: del, Reconciled: reconciled}, err
}

// membership is the epoch, the up servers (sorted by id) and the pools.
func (m *Master) membership(ctx context.Context) (api.Membership, error) {
	ps, err := m.meta.Pools(ctx)
	if err != nil {
		return api.Membership{}, err
	}
	var out api.Membership
	for _, p := range ps {
		out.Pools = append(out.Pools, api.Pool{Name: p.Name, Replicas: p.Replicas})
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	out.Epoch = m.epoch
	for _, s := range m.servers {
		if s.serving() || s.presumed {
			out.Members = append(out.Members, placement.Member{ID: s.info.ID, Addr: s.info.Addr})
		}
	}
	sort.Slice(out.Members, func(i, j int) bool { return out.Members[i].ID < out.Members[j].ID })
	return out, nil
}

func (m *Master) pool(ctx context.Context, name string) (meta.Pool, error) {
	ps, err := m.meta.Pools(ctx)
	if err != nil {
		return meta.Pool{}, err
	}
	var names []string
	for _, p := range ps {
		if p.Name == name {
			return p, nil
		}
		names = append(names, p.Name)
	}
	return meta.Pool{}, errs.New(errs.ErrNotFound, "no pool %q: pools are %s", name, strings.Join(names, ", "))
}

// place picks replicas distinct servers for chunk idx of file fileID by
// placement.Weighted over the up servers with need bytes free: a file's
// chunks spread over all servers, the emptier ones take proportionally
// more, and the choice depends only on (file, chunk) and the servers' free
// space, not on which master process makes it.
func (m *Master) place(fileID, idx int64, replicas int, need int64) ([]string, error) {
	return m.placeExcept(fileID, idx, replicas, need, nil)
}

// placeExcept is place over the serving servers not in skip.
func (m *Master) placeExcept(fileID, idx int64, replicas int, need int64, skip map[string]bool) ([]string, error) {
	if m.warming() {
		return nil, m.errWarming()
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	var cs []placement.Candidate
	up := 0
	for id, s := range m.servers {
		if !s.serving() || skip[id] {
			continue
		}
		up++
		if free := s.info.Free(); free >= need {
			cs = append(cs, placement.Candidate{ID: id, Free: free})
		}
	}
	if len(cs) < replicas {
		return nil, errs.New(errs.ErrUnavailable, "placement needs %d servers with %d bytes free, %d of %d up servers have it: start more servers, free space, or use a pool with fewer replicas", replicas, need, len(cs), up)
	}
	return placement.Weighted([]byte(fmt.Sprintf("%d/%d", fileID, idx)), cs, replicas), nil
}

// chunksOut turns meta chunks into API chunks with addresses and liveness.
func (m *Master) chunksOut(cs []meta.Chunk) []api.Chunk {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make([]api.Chunk, len(cs))
	for i, c := range cs {
		ac := api.Chunk{Index: c.Index, ID: c.ID, Length: c.Length}
		for _, id := range c.Replicas {
			r := api.Replica{Server: id}
			if s := m.servers[id]; s != nil {
				r.Addr, r.Up = s.info.Addr, s.serving() || s.presumed
			}
			ac.Replicas = append(ac.Replicas, r)
		}
		out[i] = ac
	}
	return out
}

func fileOut(f meta.File) api.File {
	return api.File{Path: f.Path, Pool: f.Pool, ChunkSize: f.ChunkSize, Size: f.Size, Sealed: f.Sealed, Modified: f.Modified}
}

func (m *Master) status(ctx context.Context) (api.Status, error) {
	ps, err := m.meta.Pools(ctx)
	if err != nil {
		return api.Status{}, err
	}
	n, b, err := m.meta.Totals(ctx)
	if err != nil {
		return api.Status{}, err
	}
	st := api.Status{Cluster: m.cfg.Cluster, Files: n, Bytes: b}
	for _, p := range ps {
		st.Pools = append(st.Pools, api.Pool{Name: p.Name, Replicas: p.Replicas})
	}
	m.mu.Lock()
	st.Epoch = m.epoch
	for _, s := range m.servers {
		st.Servers = append(st.Servers, s.info)
	}
	m.mu.Unlock()
	sort.Slice(st.Servers, func(i, j int) bool { return st.Servers[i].ID < st.Servers[j].ID })
	return st, nil
}

// repair restores the replica count of HA chunks held by servers that have
// been down longer than RepairAfter: a surviving replica is copied to a live
// server that holds none, then the replica list is updated.
func (m *Master) repair(ctx context.Context) {
	m.mu.Lock()
	var dead []string
	for id, s := range m.servers {
		if !s.up && time.Since(s.downAt) > m.cfg.RepairAfter {
			dead = append(dead, id)
		}
	}
	m.mu.Unlock()
	for _, id := range dead {
		cs, err := m.meta.ChunksOn(ctx, id)
		if err != nil {
			return
		}
		for _, c := range cs {
			p, err := m.pool(ctx, c.Pool)
			if err != nil || p.Replicas < 2 {
				continue // perf data is recomputable: it is not repaired
			}
			if err := m.repairChunk(ctx, c, id); err != nil {
				// Try again next round; meanwhile the other chunks go on (one
				// that cannot be copied must not hold back the rest).
				m.log.Warn("repair chunk", "chunk", c.ID, "dead", id, "err", err)
				m.metrics.repairs.WithLabelValues("failed").Inc()
				if ctx.Err() != nil {
					return
				}
				continue
			}
			m.metrics.repairs.WithLabelValues("ok").Inc()
		}
	}
}

func (m *Master) repairChunk(ctx context.Context, c meta.Placed, dead string) error {
	m.mu.Lock()
	var srcs []string
	holds := map[string]bool{}
	for _, r := range c.Replicas {
		holds[r] = true
		if s := m.servers[r]; s != nil && s.serving() && r != dead {
			srcs = append(srcs, s.info.Addr)
		}
	}
	var target *liveServer
	for id, s := range m.servers {
		if s.serving() && !holds[id] && s.info.Free() >= c.Length && (target == nil || s.info.Free() > target.info.Free()) {
			target = s
		}
	}
	var targetID, targetAddr string
	if target != nil {
		targetID, targetAddr = target.info.ID, target.info.Addr
	}
	m.mu.Unlock()
	if len(srcs) == 0 {
		return errs.New(errs.ErrUnavailable, "chunk %d: no live replica left to copy from", c.ID)
	}
	if target == nil {
		return errs.New(errs.ErrUnavailable, "chunk %d: no live server without a replica", c.ID)
	}
	cctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	var err error
	missing := 0
	for _, src := range srcs {
		if err = m.peers.CopyChunk(cctx, targetAddr, c.ID, src); err == nil {
			return m.meta.ReplaceReplica(ctx, c.ID, dead, targetID)
		}
		if errors.Is(err, errs.ErrNotFound) {
			missing++
		}
	}
	if missing == len(srcs) && c.Length == 0 {
		// Allocated, never committed, and no live replica has a byte of it
		// (its write failed): nothing to copy. The new replica starts
		// empty, as the others are.
		return m.meta.ReplaceReplica(ctx, c.ID, dead, targetID)
	}
	return err
}

// ---- HTTP ----

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	json.NewEncoder(w).Encode(v)
}

func writeErr(w http.ResponseWriter, err error) {
	if errors.Is(err, api.ErrRetryLater) {
		w.Header().Set("Retry-After", "1") // clients retry: nothing was done
	}
	writeJSON(w, api.HTTPStatus(err), api.Error{Error: err.Error(), Code: errs.Code(err)})
}

func pathArg(r *http.Request) (string, error) {
	return nspath.Clean("/" + r.PathValue("path"))
}

// Handler is the master's HTTP API.
func (m *Master) Handler() http.Handler {
	mux := http.NewServeMux()
	h := func(pattern string, fn func(r *http.Request) (any, error)) {
		mux.Handle(pattern, m.metrics.instrument(pattern, m.auth(func(w http.ResponseWriter, r *http.Request) {
			v, err := fn(r)
			if err != nil {
				writeErr(w, err)
				return
			}
			writeJSON(w, http.StatusOK, v)
		})))
	}
	h("POST /v1/servers/heartbeat", func(r *http.Request) (any, error) {
		var hb api.Heartbeat
		if err := readJSON(r, &hb); err != nil {
			return nil, err
		}
		return m.heartbeat(r.Context(), hb)
	})
	h("GET /v1/status", func(r *http.Request) (any, error) { return m.status(r.Context()) })
	h("GET /v1/members", func(r *http.Request) (any, error) { return m.membership(r.Context()) })
	h("GET /v1/files/{path...}", m.stat)
	h("PUT /v1/files/{path...}", m.create)
	h("DELETE /v1/files/{path...}", m.remove)
	h("POST /v1/alloc/{path...}", m.alloc)
	h("POST /v1/commit/{path...}", m.commit)
	h("POST /v1/link/{path...}", m.link)
	h("POST /v1/refill/{path...}", m.refillRoute)
	h("PUT /v1/attrs/{path...}", func(r *http.Request) (any, error) {
		p, err := pathArg(r)
		if err != nil {
			return nil, err
		}
		var attrs map[string]string
		if err := readJSON(r, &attrs); err != nil {
			return nil, err
		}
		return struct{}{}, m.meta.SetAttrs(r.Context(), p, attrs)
	})
	h("GET /v1/list/{path...}", m.list)
	h("PUT /v1/dirs/{path...}", func(r *http.Request) (any, error) {
		p, err := pathArg(r)
		if err != nil {
			return nil, err
		}
		return api.File{Path: p, IsDir: true}, m.meta.Mkdir(r.Context(), p, time.Now().UTC())
	})
	m.sessionRoutes(h)
	mux.Handle("/ui/", m.console.Handler())
	mux.Handle("GET /{$}", http.RedirectHandler("/ui/", http.StatusFound))
	mux.Handle("GET /metrics", m.metrics.handler())
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) { fmt.Fprintln(w, "ok") })
	return mux
}

func (m *Master) auth(next http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if !m.leader.Load() {
			leader, _ := m.meta.Leader(r.Context())
			w.Header().Set(api.LeaderHeader, leader)
			writeErr(w, errs.New(errs.ErrUnavailable, "this master (%s) is a standby; the leader is %s: list every master in --master / GD2FS_MASTER (%w)", m.url, leader, api.ErrRetryLater))
			return
		}
		if m.cfg.Token != "" && !tokenOK(r, m.cfg.Token) {
			writeErr(w, errs.New(errs.ErrUnauthorized, "wrong or missing cluster token: pass it with --token or GD2FS_TOKEN"))
			return
		}
		next(w, r)
	}
}

func (m *Master) stat(r *http.Request) (any, error) {
	p, err := pathArg(r)
	if err != nil {
		return nil, err
	}
	f, cs, err := m.fileAndChunks(r.Context(), p)
	if errors.Is(err, errs.ErrIsDir) {
		return api.File{Path: p, IsDir: true}, nil
	}
	if err != nil {
		return nil, err
	}
	out := fileOut(f)
	out.Chunks = m.chunksOut(cs)
	if out.Attrs, err = m.meta.Attrs(r.Context(), p); len(out.Attrs) == 0 {
		out.Attrs = nil
	}
	return out, err
}

// fileAndChunks reads a file and its chunks as one consistent answer. They
// are two queries: a remove (or a remove and a create) committed between
// them would pair the file's size with no chunks, which a client reads as
// holes, zeros where data was (the chaos harness found it). So the file is
// read again after its chunks: a file gone meanwhile is not found, one
// removed and created again is looked up again.
func (m *Master) fileAndChunks(ctx context.Context, p string) (meta.File, []meta.Chunk, error) {
	for attempt := 0; ; attempt++ {
		f, err := m.meta.File(ctx, p)
		if err != nil {
			return meta.File{}, nil, err
		}
		cs, err := m.meta.Chunks(ctx, f.ID)
		if err != nil {
			return meta.File{}, nil, err
		}
		again, err := m.meta.File(ctx, p)
		if err != nil {
			return meta.File{}, nil, err
		}
		if again.ID == f.ID {
			// Still the same file. f, not again: every chunk under f's
			// committed size was allocated before that commit, so cs
			// (read after f) holds them all; again's size may be newer.
			return f, cs, nil
		}
		if attempt == 3 {
			return meta.File{}, nil, errs.New(errs.ErrUnavailable, "%s changed during the lookup (removed and created again): retry", p)
		}
	}
}

// link registers a file whose bytes live in a cold source: every chunk is
// placed now, the file is sealed at its final size, and the chunks fill on
// first read by the server that owns them.
func (m *Master) link(r *http.Request) (any, error) {
	p, err := pathArg(r)
	if err != nil {
		return nil, err
	}
	var req api.LinkRequest
	if err := readJSON(r, &req); err != nil {
		return nil, err
	}
	if !strings.HasPrefix(req.Source, "s3://") {
		return nil, errs.New(errs.ErrBadRequest, "link needs an s3:// source and a size")
	}
	if err := meta.CheckSize(req.Size); err != nil {
		return nil, err
	}
	if req.Pool == "" {
		req.Pool = "perf"
	}
	if err := checkLinkChunks(req.Size, req.ChunkSize); err != nil {
		return nil, err
	}
	ctx := r.Context()
	if old, err := m.meta.File(ctx, p); err == nil {
		attrs, _ := m.meta.Attrs(ctx, p)
		if attrs["source"] == req.Source && attrs["etag"] == req.ETag && old.Size == req.Size {
			out := fileOut(old) // linked already
			out.Attrs = attrs
			return out, nil
		}
		return nil, errs.New(errs.ErrExists, "%s exists with other contents: remove it first", p)
	}
	f, err := m.createFile(ctx, p, req.Pool, req.ChunkSize, "")
	if err != nil {
		return nil, err
	}
	if err := m.linkChunks(ctx, f, req); err != nil {
		m.meta.RemoveFile(ctx, p)
		return nil, err
	}
	if f, err = m.meta.File(ctx, p); err != nil {
		return nil, err
	}
	out := fileOut(f)
	out.Attrs, err = m.meta.Attrs(ctx, p)
	return out, err
}

func (m *Master) linkChunks(ctx context.Context, f meta.File, req api.LinkRequest) error {
	pool, err := m.pool(ctx, f.Pool)
	if err != nil {
		return err
	}
	n := (req.Size + f.ChunkSize - 1) / f.ChunkSize
	want := make([]meta.Chunk, n)
	lengths := make(map[int64]int64, n)
	for i := range want {
		idx := int64(i)
		want[i].Index = idx
		if want[i].Replicas, err = m.place(f.ID, idx, pool.Replicas, f.ChunkSize); err != nil {
			return err
		}
		lengths[idx] = min(f.ChunkSize, req.Size-idx*f.ChunkSize)
	}
	if _, err := m.meta.AddChunks(ctx, f.ID, want); err != nil {
		return err
	}
	if _, err := m.meta.Commit(ctx, f.ID, req.Size, lengths, true, time.Now().UTC()); err != nil {
		return err
	}
	return m.meta.SetAttrs(ctx, f.Path, map[string]string{"source": req.Source, "etag": req.ETag})
}

func (m *Master) create(r *http.Request) (any, error) {
	p, err := pathArg(r)
	if err != nil {
		return nil, err
	}
	var req api.CreateRequest
	if err := readJSON(r, &req); err != nil {
		return nil, err
	}
	f, err := m.createFile(r.Context(), p, req.Pool, req.ChunkSize, req.RequestID)
	if errors.Is(err, errs.ErrExists) && req.RequestID != "" {
		// A repeat of a create whose answer was lost (the client retried
		// across a failover): the file is the one it made.
		if old, ferr := m.meta.File(r.Context(), p); ferr == nil {
			if attrs, aerr := m.meta.Attrs(r.Context(), p); aerr == nil && attrs[meta.CreateIDAttr] == req.RequestID {
				return fileOut(old), nil
			}
		}
	}
	if err != nil {
		return nil, err
	}
	return fileOut(f), nil
}

// createFile validates the pool and chunk size (defaults: ha, 16 MiB) and creates p.
func (m *Master) createFile(ctx context.Context, p, pool string, chunkSize int64, createID string) (meta.File, error) {
	if pool == "" {
		pool = "ha"
	}
	if _, err := m.pool(ctx, pool); err != nil {
		return meta.File{}, err
	}
	if chunkSize == 0 {
		chunkSize = DefaultChunkSize
	}
	if chunkSize < store.BlockSize || chunkSize > store.MaxChunk || chunkSize%store.BlockSize != 0 {
		return meta.File{}, errs.New(errs.ErrBadRequest, "chunk size %d: must be a multiple of %d between %d and %d", chunkSize, store.BlockSize, store.BlockSize, store.MaxChunk)
	}
	return m.meta.CreateFile(ctx, meta.File{Path: p, Pool: pool, ChunkSize: chunkSize, Modified: time.Now().UTC(), CreateID: createID})
}

func (m *Master) remove(r *http.Request) (any, error) {
	p, err := pathArg(r)
	if err != nil {
		return nil, err
	}
	if dir, err := m.meta.IsDir(r.Context(), p); err != nil {
		return nil, err
	} else if dir {
		return struct{}{}, m.meta.RemoveDir(r.Context(), p)
	}
	// Chunks are deleted by their servers when they next heartbeat.
	return struct{}{}, m.meta.RemoveFile(r.Context(), p)
}

func (m *Master) alloc(r *http.Request) (any, error) {
	p, err := pathArg(r)
	if err != nil {
		return nil, err
	}
	var req api.AllocRequest
	if err := readJSON(r, &req); err != nil {
		return nil, err
	}
	if len(req.Indexes) > limits.MaxChunksPerRequest {
		return nil, errs.New(errs.ErrTooLarge, "at most %d chunks per allocation", limits.MaxChunksPerRequest)
	}
	f, err := m.meta.File(r.Context(), p)
	if err != nil {
		return nil, err
	}
	if f.Sealed {
		return nil, errs.New(errs.ErrSealed, "%s is sealed: it was closed and is immutable", p)
	}
	pool, err := m.pool(r.Context(), f.Pool)
	if err != nil {
		return nil, err
	}
	want := make([]meta.Chunk, 0, len(req.Indexes))
	existing, err := m.meta.Chunks(r.Context(), f.ID)
	if err != nil {
		return nil, err
	}
	have := map[int64]bool{}
	for _, c := range existing {
		have[c.Index] = true
	}
	for _, idx := range req.Indexes {
		if idx < 0 || idx > math.MaxInt64/f.ChunkSize-1 {
			return nil, errs.New(errs.ErrOutOfRange, "chunk index %d out of range", idx)
		}
		c := meta.Chunk{Index: idx}
		if !have[idx] {
			if c.Replicas, err = m.place(f.ID, idx, pool.Replicas, f.ChunkSize); err != nil {
				return nil, err
			}
		}
		want = append(want, c)
	}
	cs, err := m.meta.AddChunks(r.Context(), f.ID, want)
	if err != nil {
		return nil, err
	}
	return api.Chunks{Chunks: m.chunksOut(cs)}, nil
}

func (m *Master) commit(r *http.Request) (any, error) {
	p, err := pathArg(r)
	if err != nil {
		return nil, err
	}
	var req api.CommitRequest
	if err := readJSON(r, &req); err != nil {
		return nil, err
	}
	f, err := m.meta.File(r.Context(), p)
	if err != nil {
		return nil, err
	}
	if err := meta.CheckSize(req.Size); err != nil {
		return nil, err
	}
	if f.Sealed && req.Seal && req.Size == f.Size {
		// A repeat of the sealing commit (its answer was lost in a
		// failover): already done.
		return fileOut(f), nil
	}
	f, err = m.meta.Commit(r.Context(), f.ID, req.Size, req.Lengths, req.Seal, time.Now().UTC())
	if err != nil {
		return nil, err
	}
	return fileOut(f), nil
}

func (m *Master) list(r *http.Request) (any, error) {
	p, err := pathArg(r)
	if err != nil {
		return nil, err
	}
	es, err := m.meta.List(r.Context(), p)
	if err != nil {
		return nil, err
	}
	out := api.Listing{Entries: make([]api.File, 0, len(es))}
	for _, e := range es {
		if e.IsDir {
			out.Entries = append(out.Entries, api.File{Path: e.Path, IsDir: true})
		} else {
			out.Entries = append(out.Entries, fileOut(e.File))
		}
	}
	return out, nil
}
