// Package server is the gd2fs data server: it holds chunks in a store (DRAM
// and disk tiers), serves them over the binary protocol, forwards writes to
// the other replicas of HA-pool chunks, and heartbeats to the master.
//
// One TCP port carries both the binary data plane and HTTP (/metrics,
// /healthz): the first four bytes of a connection tell which.
package server

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"encoding/hex"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gd2fs/gd2fs/client"
	"github.com/gd2fs/gd2fs/internal/api"
	"github.com/gd2fs/gd2fs/internal/authlimit"
	"github.com/gd2fs/gd2fs/internal/cold"
	"github.com/gd2fs/gd2fs/internal/kvstore"
	"github.com/gd2fs/gd2fs/internal/netguard"
	"github.com/gd2fs/gd2fs/internal/store"
)

// Config configures a data server.
type Config struct {
	ID        string // stable identity; default: kept in <disk>/server.id, else random
	Listen    string // e.g. ":7071"
	Advertise string // address clients dial; default: the listen address
	Master    string // master URL, e.g. http://127.0.0.1:7070; "" runs standalone
	Token     string // cluster token; "" accepts any client
	Store     store.Config
	KV        kvstore.Config // hash-mode KV tiers; no KV service when both are zero
	Cold      *cold.Config   // S3 endpoint for linked files; nil: no read-through
	Heartbeat time.Duration  // default 1s
	// Reconcile is how often the server asks the master about the chunks
	// that appeared since it last asked (default 10m; negative: only the
	// chunks found at start). A chunk the master records nowhere, once it
	// is at least this old, is deleted: a copy whose repair was abandoned,
	// or a chunk a plan allocated in a window a master crash lost
	// (docs/architecture.md, "Orphan chunks").
	Reconcile time.Duration
	// ForwardTimeout bounds forwarding a write to another replica: it may
	// take ForwardTimeout + bytes at 8 MiB/s (default 8s), less than a
	// client's default deadline, so a hung replica fails the write with an
	// error that names it rather than a client-side timeout.
	ForwardTimeout time.Duration
	// Debug serves /debug/pprof/ and /debug/gc (runs a GC and reports its
	// duration) on the HTTP side of the port. Off by default.
	Debug bool
	Log   *slog.Logger

	// Connection limits (docs/security.md): at most MaxConns connections at
	// once (default 8192; the rest are closed at once); a connection must
	// send its hello within HelloTimeout (10s) and each frame's payload
	// within PayloadTimeout (60s) of its header, and is closed after
	// IdleTimeout (5m) with no request in flight. Until its hello a
	// connection is the first to be closed when the port is full, and one
	// address holds at most MaxConnsPerIP (512; negative: no bound) such;
	// HTTP connections (metrics, health) never say hello and idle at most
	// HelloTimeout between requests.
	MaxConns, MaxConnsPerIP                   int
	HelloTimeout, PayloadTimeout, IdleTimeout time.Duration
	// TLS, when set, serves the port (data plane and HTTP) over TLS only.
	// ClientTLS is how this server dials its peers and the master (nil:
	// plain TCP and http://).
	TLS, ClientTLS *tls.Config
	// KVMoveRate bounds the bytes per second the background move of KV
	// blocks after a membership change copies (default DefaultKVMoveRate).
	KVMoveRate int64
	// KVFlushOnClose: Close writes the KV blocks only in DRAM to the KV
	// disk tier (into its free room) before closing it, so a restart has
	// them. gd2fs server and gd2fs up set it: SIGTERM and Ctrl-C keep them.
	KVFlushOnClose bool
	// Peers carries this server's hops to other servers: forwards of
	// writes to the other replicas, copies of chunks (repair) and of KV
	// blocks (membership moves). nil: the TCP transport
	// (client.NewTCPPeerTransport with Token and ClientTLS). The server
	// owns it: Close closes it.
	Peers client.PeerTransport
}

// Server is a running data server.
type Server struct {
	cfg   Config
	log   *slog.Logger
	store *store.Store
	kv    *kvstore.Store // nil without KV tiers
	cold  *cold.Source   // nil without S3 configuration
	fills filler
	// Counters reported in heartbeats (gd2fs status).
	servedBytes, coldBytes atomic.Int64
	peers                  peers
	ln                     *netguard.Listener
	httpLn                 *chanListener
	httpSrv                *http.Server
	metrics                *metrics
	master                 *api.Client
	health                 health // what /readyz answers from (health.go)

	ms          atomic.Pointer[api.Membership]
	hbSent      atomic.Uint64      // heartbeats sent, numbering them (heartbeat.go)
	msSeq       uint64             // the number of the heartbeat whose reply ms is; under mu
	guesses     *authlimit.Limiter // hellos with a wrong token, by address
	kvm         kvMoves            // KV blocks moving after membership changes (kvmove.go)
	warm        chunkWarm          // chunk prefetches in flight (chunkprefetch.go)
	refreshMu   sync.Mutex
	lastRefresh time.Time // of the membership on a client's epoch; under refreshMu
	mu          sync.Mutex
	conns       map[net.Conn]struct{}
	closed      bool
	deleted     []uint64             // chunk deletions to acknowledge in the next heartbeat
	held        []uint64             // chunks to reconcile (found at start, then recon's), until the master did
	heldGen     uint64               // counts the lists held has been
	copies      map[uint64]copyState // chunks copied here lately (copyFrom), by id
	recon       reconcile
	wg          sync.WaitGroup

	// life ends when Close is called: forwards, copies, S3 fills and
	// membership refreshes run under it, so Close never waits out their
	// timeouts and nothing outlives the server.
	life context.Context
	stop context.CancelFunc
}

// New opens the store and starts listening; Run serves.
func New(cfg Config) (*Server, error) {
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	if cfg.Heartbeat <= 0 {
		cfg.Heartbeat = time.Second
	}
	if cfg.Reconcile == 0 {
		cfg.Reconcile = DefaultReconcile
	}
	if cfg.ForwardTimeout <= 0 {
		cfg.ForwardTimeout = DefaultForwardTimeout
	}
	cfg.fillLimits()
	cfg.Store.Log = cfg.Log
	st, err := store.Open(cfg.Store)
	if err != nil {
		return nil, err
	}
	if cfg.ID == "" {
		if cfg.ID, err = loadID(cfg.Store.Dir); err != nil {
			st.Close()
			return nil, err
		}
	}
	var kv *kvstore.Store
	if cfg.KV.MemBytes > 0 || cfg.KV.Dir != "" {
		cfg.KV.Log = cfg.Log
		if kv, err = kvstore.Open(cfg.KV); err != nil {
			st.Close()
			return nil, err
		}
	}
	cs, err := newCold(cfg.Cold)
	if err != nil {
		st.Close()
		if kv != nil {
			kv.Close() // it holds its segment files and writer goroutine
		}
		return nil, err
	}
	tl, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		st.Close()
		if kv != nil {
			kv.Close()
		}
		return nil, fmt.Errorf("server: listen on %s: %w (is another server using the port?)", cfg.Listen, err)
	}
	ln := netguard.New(tl, cfg.MaxConns, cfg.Log).Protect(max(cfg.MaxConnsPerIP, 0), 0)
	if cfg.Advertise == "" {
		cfg.Advertise = advertise(ln.Addr().String())
	}
	s := &Server{
		cfg: cfg, log: cfg.Log.With("server", cfg.ID), store: st, kv: kv, cold: cs, fills: filler{inflight: map[uint64]*fill{}}, ln: ln,
		peers:   peers{cfg.Peers},
		httpLn:  newChanListener(ln.Addr()),
		guesses: authlimit.New("data server", cfg.Log),
		conns:   make(map[net.Conn]struct{}),
	}
	if cfg.Peers == nil {
		s.peers = peers{client.NewTCPPeerTransport(client.TCPOptions{Token: cfg.Token, Name: "server-" + cfg.ID, Streams: 2, TLS: cfg.ClientTLS})}
	}
	s.life, s.stop = context.WithCancel(context.Background())
	s.metrics = newMetrics(s)
	// Taken before serving: a chunk written after this is the master's own
	// allocation and can never look like an orphan.
	s.held = st.IDs()
	s.recon = reconcile{prev: s.held, last: time.Now()}
	if cfg.Master != "" {
		// RetryFor -1: one pass over the masters per call. The heartbeat
		// loop is the retry: every tick tries each master again, so a server
		// finds a new leader one tick after it took over.
		s.master = &api.Client{Base: cfg.Master, Token: cfg.Token, RetryFor: -1, Role: "server", HTTP: &http.Client{Timeout: 5 * time.Second,
			Transport: &http.Transport{TLSClientConfig: cfg.ClientTLS}}}
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", s.metrics.handler())
	s.healthRoutes(mux) // /healthz, /readyz: health.go
	if cfg.Debug {
		// Behind the token (issue 22 finding 17): a profile shows memory
		// and a GC costs the whole server.
		mux.Handle("/debug/pprof/", debugAuth(cfg.Token, http.HandlerFunc(pprof.Index)))
		mux.Handle("/debug/pprof/profile", debugAuth(cfg.Token, http.HandlerFunc(pprof.Profile)))
		mux.Handle("/debug/gc", debugAuth(cfg.Token, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			start := time.Now()
			runtime.GC()
			el := time.Since(start)
			var ms runtime.MemStats
			runtime.ReadMemStats(&ms)
			fmt.Fprintf(w, "{\"gc_seconds\": %g, \"heap_alloc\": %d, \"heap_objects\": %d, \"num_gc\": %d, \"last_pause_seconds\": %g}\n",
				el.Seconds(), ms.HeapAlloc, ms.HeapObjects, ms.NumGC, float64(ms.PauseNs[(ms.NumGC+255)%256])/1e9)
		})))
	}
	s.httpSrv = &http.Server{Handler: mux, ReadHeaderTimeout: cfg.HelloTimeout, ReadTimeout: cfg.PayloadTimeout,
		WriteTimeout: cfg.PayloadTimeout, IdleTimeout: min(cfg.IdleTimeout, cfg.HelloTimeout), MaxHeaderBytes: 64 << 10}
	return s, nil
}

// advertise turns a wildcard listen address into one a local client can
// dial; servers on other machines set Config.Advertise.
func advertise(addr string) string {
	host, port, _ := net.SplitHostPort(addr)
	if ip := net.ParseIP(host); ip == nil || ip.IsUnspecified() {
		return net.JoinHostPort("127.0.0.1", port)
	}
	return addr
}

func loadID(dir string) (string, error) {
	var b [6]byte
	rand.Read(b[:])
	id := "s-" + hex.EncodeToString(b[:])
	if dir == "" {
		return id, nil
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", fmt.Errorf("server: create %s: %w", dir, err)
	}
	p := filepath.Join(dir, "server.id")
	if old, err := os.ReadFile(p); err == nil && len(strings.TrimSpace(string(old))) > 0 {
		return strings.TrimSpace(string(old)), nil
	}
	// Atomic and durable: a server that lost power while writing its id
	// must not come back with an empty one (a new identity, its chunks
	// orphaned).
	return id, store.WriteFileAtomic(p, []byte(id+"\n"), 0o600)
}

// ID is the server's identity.
func (s *Server) ID() string { return s.cfg.ID }

// Prefaulted is closed once the DRAM tiers' prefault (Config.Store.Prefault,
// Config.KV.Prefault) has ended, at once without one: a benchmark waits for
// it so that it measures a server whose memory is in place.
func (s *Server) Prefaulted() <-chan struct{} {
	if s.kv == nil {
		return s.store.Prefaulted()
	}
	c := make(chan struct{})
	go func() {
		<-s.store.Prefaulted()
		<-s.kv.Prefaulted()
		close(c)
	}()
	return c
}

// Addr is the address clients dial.
func (s *Server) Addr() string { return s.cfg.Advertise }

// Store exposes the chunk store (for tests and status).
func (s *Server) Store() *store.Store { return s.store }

// Run serves connections and heartbeats until ctx ends or Close is called.
func (s *Server) Run(ctx context.Context) error {
	go s.httpSrv.Serve(s.httpLn)
	if s.master != nil {
		// The loop runs under the server's own lifetime, which Close ends
		// (and so does ctx, below): Close must not wait out a heartbeat
		// interval or a heartbeat in flight.
		if !s.addWorker() {
			return nil
		}
		go s.heartbeatLoop(s.life)
	}
	if s.kv != nil && s.addWorker() {
		go s.kvExpiryLoop()
	}
	// Ends with the server too: with a ctx that never ends
	// (context.Background, as internal/cluster runs servers) it waited for
	// ever, one goroutine per server a test process ever started, filling
	// the goroutine dump of a test that timed out.
	go func() {
		select {
		case <-ctx.Done():
			s.Close()
		case <-s.life.Done():
		}
	}()
	// The guarded listener retries accept errors (EMFILE) itself and
	// returns one only once it is closed: this loop never ends while the
	// server is meant to be up; heartbeats report it unhealthy meanwhile.
	for {
		nc, release, err := s.ln.AcceptTracked()
		if err != nil {
			s.mu.Lock()
			closed := s.closed
			s.mu.Unlock()
			if closed {
				return nil
			}
			return fmt.Errorf("server: accept: %w", err)
		}
		if !s.addWorker() {
			nc.Close()
			release()
			return nil
		}
		go s.route(nc, release)
	}
}

// Close stops serving, closes connections and the store.
// addWorker counts one more goroutine that Close waits for, unless Close
// has begun (then it reports false): an Add after Close's Wait started
// would race it (sync.WaitGroup), as a Run started just before Close did.
func (s *Server) addWorker() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return false
	}
	s.wg.Add(1)
	return true
}

func (s *Server) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	for c := range s.conns {
		c.Close()
	}
	s.mu.Unlock()
	s.stop()
	s.ln.Close()
	s.httpSrv.Close()
	s.peers.Close()
	s.wg.Wait()
	if s.kv != nil {
		s.kvFlush()
		s.kv.Close()
	}
	return s.store.Close()
}
