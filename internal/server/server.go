// Package server is the gd2fs data server: it holds chunks in a store (DRAM
// and disk tiers), serves them over the binary protocol, forwards writes to
// the other replicas of HA-pool chunks, and heartbeats to the master.
//
// One TCP port carries both the binary data plane and HTTP (/metrics,
// /healthz): the first four bytes of a connection tell which.
package server

import (
	"bufio"
	"context"
	"crypto/rand"
	"crypto/subtle"
	"crypto/tls"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
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
	"syscall"
	"time"

	"github.com/gd2fs/gd2fs/errs"
	"github.com/gd2fs/gd2fs/internal/api"
	"github.com/gd2fs/gd2fs/internal/bufpool"
	"github.com/gd2fs/gd2fs/internal/cold"
	"github.com/gd2fs/gd2fs/internal/kvstore"
	"github.com/gd2fs/gd2fs/internal/netguard"
	"github.com/gd2fs/gd2fs/internal/rpc"
	"github.com/gd2fs/gd2fs/internal/store"
	"github.com/gd2fs/gd2fs/internal/wire"
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
	// IdleTimeout (5m) with no request in flight.
	MaxConns                                  int
	HelloTimeout, PayloadTimeout, IdleTimeout time.Duration
	// TLS, when set, serves the port (data plane and HTTP) over TLS only.
	// ClientTLS is how this server dials its peers and the master (nil:
	// plain TCP and http://).
	TLS, ClientTLS *tls.Config
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
	peers                  *rpc.Pool
	ln                     *netguard.Listener
	httpLn                 *chanListener
	httpSrv                *http.Server
	metrics                *metrics
	master                 *api.Client

	ms        atomic.Pointer[api.Membership]
	refreshMu sync.Mutex
	mu        sync.Mutex
	conns     map[net.Conn]struct{}
	closed    bool
	deleted   []uint64 // chunk deletions to acknowledge in the next heartbeat
	held      []uint64 // chunks found on disk at start, until the master reconciled them
	wg        sync.WaitGroup

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
	tcp, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		st.Close()
		if kv != nil {
			kv.Close()
		}
		return nil, fmt.Errorf("server: listen on %s: %w (is another server using the port?)", cfg.Listen, err)
	}
	ln := netguard.New(tcp, cfg.MaxConns, cfg.Log)
	if cfg.Advertise == "" {
		cfg.Advertise = advertise(ln.Addr().String())
	}
	s := &Server{
		cfg: cfg, log: cfg.Log.With("server", cfg.ID), store: st, kv: kv, cold: cs, fills: filler{inflight: map[uint64]*fill{}}, ln: ln,
		peers:  rpc.NewPool(rpc.Options{Token: cfg.Token, Name: "server-" + cfg.ID, Streams: 2, TLS: cfg.ClientTLS}),
		httpLn: newChanListener(ln.Addr()),
		conns:  make(map[net.Conn]struct{}),
	}
	s.life, s.stop = context.WithCancel(context.Background())
	s.metrics = newMetrics(s)
	// Taken before serving: a chunk written after this is the master's own
	// allocation and can never look like an orphan.
	s.held = []uint64{}
	for _, c := range st.List() {
		s.held = append(s.held, c.ID)
	}
	if cfg.Master != "" {
		// RetryFor -1: one pass over the masters per call. The heartbeat
		// loop is the retry: every tick tries each master again, so a server
		// finds a new leader one tick after it took over.
		s.master = &api.Client{Base: cfg.Master, Token: cfg.Token, RetryFor: -1, HTTP: &http.Client{Timeout: 5 * time.Second,
			Transport: &http.Transport{TLSClientConfig: cfg.ClientTLS}}}
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", s.metrics.handler())
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, r *http.Request) { fmt.Fprintln(w, "ok") })
	if cfg.Debug {
		mux.HandleFunc("/debug/pprof/", pprof.Index)
		mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
		mux.HandleFunc("/debug/gc", func(w http.ResponseWriter, r *http.Request) {
			start := time.Now()
			runtime.GC()
			el := time.Since(start)
			var ms runtime.MemStats
			runtime.ReadMemStats(&ms)
			fmt.Fprintf(w, "{\"gc_seconds\": %g, \"heap_alloc\": %d, \"heap_objects\": %d, \"num_gc\": %d, \"last_pause_seconds\": %g}\n",
				el.Seconds(), ms.HeapAlloc, ms.HeapObjects, ms.NumGC, float64(ms.PauseNs[(ms.NumGC+255)%256])/1e9)
		})
	}
	s.httpSrv = &http.Server{Handler: mux, ReadHeaderTimeout: cfg.HelloTimeout, ReadTimeout: cfg.PayloadTimeout,
		WriteTimeout: cfg.PayloadTimeout, IdleTimeout: cfg.IdleTimeout, MaxHeaderBytes: 64 << 10}
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
		s.wg.Add(1)
		go s.heartbeatLoop(s.life)
	}
	go func() { <-ctx.Done(); s.Close() }()
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
		s.wg.Add(1)
		go s.route(nc, release)
	}
}

// Close stops serving, closes connections and the store.
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
		s.kv.Close()
	}
	return s.store.Close()
}

func (s *Server) track(c net.Conn, on bool) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if on {
		if s.closed {
			return false
		}
		s.conns[c] = struct{}{}
	} else {
		delete(s.conns, c)
	}
	return true
}

// route sniffs the first bytes: a gd2fs frame starts with the magic, anything
// else is handed to the HTTP server.
func (s *Server) route(nc net.Conn, release func()) {
	defer s.wg.Done()
	if s.cfg.TLS != nil {
		nc = tls.Server(nc, s.cfg.TLS) // the handshake runs in Peek, under the hello deadline
	}
	br := bufio.NewReaderSize(nc, 256<<10)
	// The hello deadline covers the TLS handshake, the sniff and the hello
	// frame: a connection that sends only the magic is closed after it.
	nc.SetReadDeadline(time.Now().Add(s.cfg.HelloTimeout))
	head, err := br.Peek(4)
	if err != nil {
		nc.Close()
		release()
		return
	}
	if string(head) != "GD2F" {
		nc.SetReadDeadline(time.Time{}) // the HTTP server sets its own
		s.httpLn.deliver(&peekedConn{Conn: nc, r: br, release: release})
		return
	}
	defer release()
	if !s.track(nc, true) {
		nc.Close()
		return
	}
	defer s.track(nc, false)
	s.serveData(nc, br)
}

// heartbeatLoop registers with the master and keeps reporting usage; the
// replies carry the epoch and chunks to delete.
func (s *Server) heartbeatLoop(ctx context.Context) {
	defer s.wg.Done()
	t := time.NewTicker(s.cfg.Heartbeat)
	defer t.Stop()
	warned := false
	for {
		if err := s.heartbeat(ctx); err != nil && !warned && ctx.Err() == nil {
			s.log.Warn("heartbeat to master failed; retrying", "master", s.cfg.Master, "err", err)
			warned = true
		} else if err == nil {
			warned = false
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		s.mu.Lock()
		closed := s.closed
		s.mu.Unlock()
		if closed {
			return
		}
	}
}

func (s *Server) heartbeat(ctx context.Context) error {
	u := s.store.Usage()
	s.mu.Lock()
	acked := s.deleted
	s.deleted = nil
	held := s.held
	s.mu.Unlock()
	hb := api.Heartbeat{ServerInfo: api.ServerInfo{ID: s.cfg.ID, Addr: s.cfg.Advertise,
		MemCap: u.MemCap, MemUsed: u.MemUsed, DiskCap: u.DiskCap, DiskUsed: u.DiskUsed, Chunks: u.Chunks,
		ServedBytes: s.servedBytes.Load(), ColdBytes: s.coldBytes.Load(), KV: s.kvStats(), Unhealthy: s.unhealthy()},
		Deleted: acked, Held: held}
	var reply api.HeartbeatReply
	if err := s.master.Do(ctx, "POST", "/v1/servers/heartbeat", hb, &reply); err != nil {
		s.mu.Lock()
		s.deleted = append(s.deleted, acked...)
		s.mu.Unlock()
		return err
	}
	s.ms.Store(&reply.Membership)
	if reply.Reconciled {
		s.mu.Lock()
		s.held = nil
		s.mu.Unlock()
	}
	var done []uint64
	for _, id := range reply.Delete {
		if err := s.store.Delete(id); err == nil || errors.Is(err, errs.ErrNotFound) {
			done = append(done, id)
		}
	}
	s.mu.Lock()
	s.deleted = append(s.deleted, done...)
	s.mu.Unlock()
	return nil
}

// ---- data plane ----

const maxInflight = 16 // per connection; bounds pooled payload memory

type dataConn struct {
	s   *Server
	nc  net.Conn
	wmu sync.Mutex
	sem chan struct{} // requests in flight

	dmu     sync.Mutex // orders read-deadline changes (deadline.go)
	waiting bool       // the reader waits for a frame header
}

func (s *Server) serveData(nc net.Conn, br *bufio.Reader) {
	dc := &dataConn{s: s, nc: nc, sem: make(chan struct{}, maxInflight)}
	r := wire.NewReader(br, wire.DefaultLimits)
	defer nc.Close()
	s.metrics.conns.Inc()
	defer s.metrics.conns.Dec()

	// The first frame must be a valid handshake.
	h, key, err := r.Next()
	if err != nil {
		dc.reply(h, err)
		return
	}
	if h.Op != wire.OpHello {
		dc.reply(h, errs.New(errs.ErrUnauthorized, "first frame must be a hello handshake, got %v", h.Op))
		return
	}
	if h.PayloadLen > 4096 {
		dc.reply(h, errs.New(errs.ErrTooLarge, "hello with a %d-byte token", h.PayloadLen))
		return
	}
	s.log.Debug("client connected", "name", string(key), "remote", nc.RemoteAddr())
	tok := make([]byte, h.PayloadLen)
	if _, err := r.ReadPayload(tok, h.PayloadCRC); err != nil {
		dc.reply(h, err)
		return
	}
	if s.cfg.Token != "" && subtle.ConstantTimeCompare(tok, []byte(s.cfg.Token)) != 1 {
		s.metrics.errors.WithLabelValues("hello", "unauthorized").Inc()
		dc.reply(h, errs.New(errs.ErrUnauthorized, "wrong cluster token: pass the cluster's token (--token or GD2FS_TOKEN)"))
		return
	}
	dc.send(h, wire.StatusOK, [][]byte{[]byte(s.cfg.ID)}, 0)

	sem := dc.sem
	var wg sync.WaitGroup
	defer wg.Wait()
	for {
		dc.awaitHeader()
		h, key, err := r.Next()
		if err != nil {
			if errors.Is(err, os.ErrDeadlineExceeded) {
				return // idle past IdleTimeout, or a header that stalled
			}
			if !isEOF(err) {
				// A frame we cannot parse leaves the stream unusable: say
				// why, then close this connection only.
				s.metrics.errors.WithLabelValues(h.Op.String(), wire.StatusOf(err).String()).Inc()
				dc.reply(h, err)
			}
			return
		}
		start := time.Now()
		dc.awaitPayload()
		// Consume the payload here, in stream order: data payloads into
		// pooled buffers, small control payloads into a slice, the rest is
		// skipped. A bad CRC or an oversize control payload fails only this
		// request; any other error broke the stream.
		var bp *[]byte
		var body []byte
		if h.Op == wire.OpWrite {
			// Zero copy when the chunk's DRAM pages can take the bytes as
			// they arrive (new bytes of a cached chunk).
			if ref, perr := wire.ParseChunkRef(key); perr == nil {
				if dst, pw, ok := s.store.BeginWrite(ref.ID, int64(h.Offset), int(h.PayloadLen)); ok {
					if err := r.ReadPayloadInto(dst); err != nil {
						pw.Abort()
						return // the stream broke mid-payload
					}
					s.metrics.bytesIn.Add(float64(h.PayloadLen))
					sem <- struct{}{}
					wg.Add(1)
					go func() {
						defer func() { <-sem; dc.finished(); wg.Done() }()
						dc.done(h, start, s.writeDirect(ref, int64(h.Offset), pw, h.PayloadCRC, h.Flags))
					}()
					continue
				}
			}
		}
		switch h.Op {
		case wire.OpWrite:
			// The chunk store checks the CRC in the pass that computes its
			// block CRCs (store.WriteChecked).
			bp = bufpool.Get(int(h.PayloadLen))
			_, err = r.ReadPayloadUnchecked(*bp)
			body = *bp
			s.metrics.bytesIn.Add(float64(h.PayloadLen))
		case wire.OpKVPut:
			bp = bufpool.Get(int(h.PayloadLen))
			_, err = r.ReadPayload(*bp, h.PayloadCRC)
			body = *bp
			s.metrics.bytesIn.Add(float64(h.PayloadLen))
		case wire.OpCopy:
			if h.PayloadLen > 4096 {
				if err = r.Discard(); err == nil {
					err = errs.New(errs.ErrTooLarge, "%v payload of %d bytes", h.Op, h.PayloadLen)
				}
				break
			}
			body = make([]byte, h.PayloadLen)
			_, err = r.ReadPayload(body, h.PayloadCRC)
		default:
			err = r.Discard()
		}
		if err != nil {
			if bp != nil {
				bufpool.Put(bp)
			}
			if !errors.Is(err, errs.ErrChecksum) && !errors.Is(err, errs.ErrTooLarge) {
				return
			}
			dc.done(h, start, err)
			continue
		}
		key = append([]byte(nil), key...) // the reader reuses its key buffer
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer func() {
				if bp != nil {
					bufpool.Put(bp)
				}
				<-sem
				dc.finished()
				wg.Done()
			}()
			s.handle(dc, h, key, body, start)
		}()
	}
}

// handle serves one request whose payload has been read.
func (s *Server) handle(dc *dataConn, h wire.Header, key, body []byte, start time.Time) {
	switch h.Op {
	case wire.OpWrite, wire.OpRead, wire.OpStat, wire.OpSeal, wire.OpDelete, wire.OpCopy:
		ref, err := wire.ParseChunkRef(key)
		if err != nil {
			dc.done(h, start, err)
			return
		}
		switch h.Op {
		case wire.OpWrite:
			dc.done(h, start, s.write(ref, int64(h.Offset), body, h.PayloadCRC, h.Flags))
		case wire.OpRead:
			s.read(dc, h, ref.ID, start)
		default:
			s.control(dc, h, ref.ID, body, start)
		}
	case wire.OpReadCold:
		ref, err := wire.ParseColdRef(key)
		if err != nil {
			dc.done(h, start, err)
			return
		}
		s.readCold(dc, h, ref, start)
	case wire.OpKVPut, wire.OpKVGet, wire.OpKVExists, wire.OpKVDelete, wire.OpKVScan:
		ref, err := wire.ParseKVRef(key)
		if err != nil {
			dc.done(h, start, err)
			return
		}
		if h.Op == wire.OpKVScan {
			s.kvScan(dc, h, ref, start)
			return
		}
		if h.Op != wire.OpKVPut {
			s.kvOp(dc, h, ref, start)
			return
		}
		existed, err := s.kvPut(ref, int64(h.Offset), h.Flags&wire.FlagOverwrite != 0, body, h.PayloadCRC)
		if err == nil && existed {
			s.metrics.observe(h.Op, start, nil)
			dc.send(h, wire.StatusOK, nil, wire.FlagExisted)
			return
		}
		dc.done(h, start, err)
	case wire.OpPing:
		dc.done(h, start, nil)
	default:
		dc.done(h, start, errs.New(errs.ErrUnknownOp, "unknown opcode %d: this server speaks protocol version %d", h.Op, wire.Version))
	}
}

func isEOF(err error) bool {
	return errors.Is(err, io.EOF) || errors.Is(err, net.ErrClosed) || errors.Is(err, syscall.ECONNRESET)
}

// durable is the acknowledgement rule (docs/architecture.md, "Durability"):
// by default a write to a replicated chunk (the primary got a forward list)
// and a write flagged wire.FlagSync (a primary's forward) are on disk before
// they are acknowledged; a write to a chunk of one replica is in the page
// cache. --sync always / never change that for this server.
func (s *Server) durable(ref wire.ChunkRef, flags uint16) bool {
	switch s.cfg.Store.Sync {
	case store.SyncAlways:
		return true
	case store.SyncNever:
		return false
	}
	return len(ref.Forward) > 0 || flags&wire.FlagSync != 0
}

// forwardFlags are the flags of a write a primary forwards: FlagSync unless
// this server syncs nothing (then the cluster is run that way).
func (s *Server) forwardFlags() uint16 {
	if s.cfg.Store.Sync == store.SyncNever {
		return 0
	}
	return wire.FlagSync
}

// write stores locally and forwards to the other replicas in parallel; it
// succeeds only when every copy succeeded (DESIGN.md §8) and, for a
// replicated chunk, is on every replica's disk.
func (s *Server) write(ref wire.ChunkRef, off int64, p []byte, crc uint32, flags uint16) error {
	if len(ref.Forward) == 0 {
		err := s.store.WriteChecked(ref.ID, off, p, crc)
		if err == nil && s.durable(ref, flags) {
			err = s.store.Sync(ref.ID)
		}
		return err
	}
	errc := make(chan error, len(ref.Forward))
	d := s.forwardTimeout(len(p))
	ctx, cancel := context.WithTimeout(s.life, d)
	defer cancel()
	for _, addr := range ref.Forward {
		go func() {
			if err := s.peers.ForwardChunk(ctx, addr, ref.ID, off, p, nil, crc, s.forwardFlags()); err != nil {
				errc <- forwardErr(ctx, addr, d, err)
				return
			}
			errc <- nil
		}()
	}
	err := s.store.WriteChecked(ref.ID, off, p, crc)
	if err == nil && s.durable(ref, flags) {
		err = s.store.Sync(ref.ID) // while the replicas sync theirs
	}
	for range ref.Forward {
		if e := <-errc; e != nil && err == nil {
			err = e
		}
	}
	return err
}

// writeDirect completes a write received straight into DRAM pages: it
// forwards the same pages to the other replicas while committing locally.
func (s *Server) writeDirect(ref wire.ChunkRef, off int64, pw *store.Pending, crc uint32, flags uint16) error {
	if len(ref.Forward) == 0 {
		err := pw.Commit(crc)
		if err == nil && s.durable(ref, flags) {
			err = s.store.Sync(ref.ID)
		}
		return err
	}
	errc := make(chan error, len(ref.Forward))
	n := 0
	for _, b := range pw.Bytes() {
		n += len(b)
	}
	d := s.forwardTimeout(n)
	ctx, cancel := context.WithTimeout(s.life, d)
	defer cancel()
	// Forwards and the local commit run together; the pages stay pinned
	// and the chunk locked until the forwards are done (CommitWhen waits).
	var wg sync.WaitGroup
	for _, addr := range ref.Forward {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := s.peers.ForwardChunkV(ctx, addr, ref.ID, off, pw.Bytes(), crc, s.forwardFlags()); err != nil {
				errc <- forwardErr(ctx, addr, d, err)
			}
		}()
	}
	// The local fdatasync runs while the replicas write and sync theirs
	// (Sync does not need the chunk lock CommitWhen holds meanwhile).
	var serr error
	err := pw.CommitWhen(crc, func() {
		if s.durable(ref, flags) {
			serr = s.store.Sync(ref.ID)
		}
		wg.Wait()
	})
	close(errc)
	if err == nil {
		err = serr
	}
	if err == nil {
		err = <-errc
	}
	return err
}

// DefaultForwardTimeout is Config.ForwardTimeout's default.
const DefaultForwardTimeout = 8 * time.Second

// forwardTimeout is the deadline of forwarding n bytes to a replica.
func (s *Server) forwardTimeout(n int) time.Duration {
	return s.cfg.ForwardTimeout + time.Duration(n)*time.Second/(8<<20)
}

// forwardErr names the replica a forward failed on; a missed deadline is
// errs.ErrUnavailable, which clients treat as retryable.
func forwardErr(ctx context.Context, addr string, d time.Duration, err error) error {
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		return errs.New(errs.ErrUnavailable, "replica %s did not answer within %s (stopped, overloaded or cut off); the write is not complete: retry it: %w", addr, d.Round(time.Millisecond), err)
	}
	return fmt.Errorf("replica %s: %w", addr, err)
}

func (s *Server) read(dc *dataConn, h wire.Header, id uint64, start time.Time) {
	s.readWithFlags(dc, h, id, start, 0)
}

func (s *Server) readWithFlags(dc *dataConn, h wire.Header, id uint64, start time.Time, flags uint16) {
	if h.Count > uint64(wire.DefaultLimits.MaxPayload) {
		dc.done(h, start, errs.New(errs.ErrTooLarge, "read of %d bytes beyond the %d-byte frame limit: split it", h.Count, wire.DefaultLimits.MaxPayload))
		return
	}
	if h.Offset > store.MaxChunk {
		dc.done(h, start, errs.New(errs.ErrOutOfRange, "read offset %d beyond any chunk", h.Offset))
		return
	}
	sent := false
	err := s.store.Read(id, int64(h.Offset), int64(h.Count), func(bufs [][]byte, crc uint32) error {
		sent = true
		s.metrics.bytesOut.Add(float64(h.Count))
		s.servedBytes.Add(int64(h.Count))
		return dc.sendCRC(h, wire.StatusOK, bufs, flags, crc)
	})
	if !sent {
		dc.done(h, start, err)
		return
	}
	s.metrics.observe(h.Op, start, err)
}

func (s *Server) control(dc *dataConn, h wire.Header, id uint64, body []byte, start time.Time) {
	switch h.Op {
	case wire.OpStat:
		info, err := s.store.Stat(id)
		if err != nil {
			dc.done(h, start, err)
			return
		}
		var flags uint16
		if info.Sealed {
			flags = wire.FlagSealed
		}
		out := h
		out.Offset = uint64(info.Length)
		dc.send(out, wire.StatusOK, nil, flags)
		s.metrics.observe(h.Op, start, nil)
	case wire.OpSeal:
		dc.done(h, start, s.store.Seal(id))
	case wire.OpDelete:
		dc.done(h, start, s.store.Delete(id))
	case wire.OpCopy:
		dc.done(h, start, s.copyFrom(id, string(body)))
	}
}

// copyFrom fetches chunk id from server src: used by the master to restore
// the replica count of HA chunks after a server is lost.
func (s *Server) copyFrom(id uint64, src string) error {
	ctx, cancel := context.WithTimeout(s.life, 5*time.Minute)
	defer cancel()
	length, sealed, err := s.peers.StatChunk(ctx, src, id)
	if err != nil {
		return fmt.Errorf("copy chunk %d from %s: %w", id, src, err)
	}
	if _, err := s.store.Stat(id); err == nil {
		if err := s.store.Delete(id); err != nil {
			return err
		}
	}
	const piece = 4 << 20
	bp := bufpool.Get(piece)
	defer bufpool.Put(bp)
	if length == 0 {
		if err := s.store.Write(id, 0, nil); err != nil {
			return err
		}
	}
	for off := int64(0); off < length; off += piece {
		n := min(piece, length-off)
		if err := s.peers.ReadChunk(ctx, src, id, off, (*bp)[:n]); err != nil {
			return fmt.Errorf("copy chunk %d from %s: %w", id, src, err)
		}
		if err := s.store.Write(id, off, (*bp)[:n]); err != nil {
			return err
		}
	}
	// A copy made to restore the replica count is as durable as the
	// replicas it joins, before the master records it as one.
	if s.cfg.Store.Sync != store.SyncNever {
		if err := s.store.Sync(id); err != nil {
			return err
		}
	}
	if sealed {
		return s.store.Seal(id)
	}
	return nil
}

// done answers h with err's status (or OK) and records metrics.
func (dc *dataConn) done(h wire.Header, start time.Time, err error) {
	dc.s.metrics.observe(h.Op, start, err)
	dc.reply(h, err)
}

func (dc *dataConn) reply(h wire.Header, err error) {
	if err == nil {
		dc.send(h, wire.StatusOK, nil, 0)
		return
	}
	var payload [][]byte
	if msg := err.Error(); msg != "" {
		payload = [][]byte{[]byte(msg)}
	}
	dc.send(h, wire.StatusOf(err), payload, 0)
}

// send writes one response frame, gathering bufs with writev.
func (dc *dataConn) send(req wire.Header, st wire.Status, bufs [][]byte, flags uint16) error {
	return dc.sendCRC(req, st, bufs, flags, wire.Checksum(bufs...))
}

// sendCRC is send for a payload whose CRC32C is already known.
func (dc *dataConn) sendCRC(req wire.Header, st wire.Status, bufs [][]byte, flags uint16, crc uint32) error {
	h := wire.Header{Op: req.Op, ReqID: req.ReqID, Status: st, Flags: flags | wire.FlagResponse, Offset: req.Offset, Count: req.Count}
	var n int
	for _, b := range bufs {
		n += len(b)
	}
	h.PayloadLen = uint32(n)
	h.PayloadCRC = crc
	var hb [wire.HeaderSize]byte
	out := make(net.Buffers, 0, 1+len(bufs))
	out = append(out, wire.Encode(hb[:], &h, nil))
	out = append(out, bufs...)
	dc.wmu.Lock()
	defer dc.wmu.Unlock()
	dc.nc.SetWriteDeadline(time.Now().Add(60 * time.Second))
	_, err := out.WriteTo(dc.nc)
	if err != nil {
		dc.nc.Close() // a partial frame: the client must reconnect
	}
	return err
}
