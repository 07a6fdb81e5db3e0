package resp

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gd2fs/gd2fs/internal/authlimit"
	"github.com/gd2fs/gd2fs/internal/kvstore"
	"github.com/gd2fs/gd2fs/internal/netguard"
)

// Config configures a RESP server.
type Config struct {
	Listen  string  // e.g. ":6380"
	Backend Backend // the key space
	Token   string  // cluster token: the AUTH password; "" accepts anyone
	Limits  Limits  // zero: DefaultLimits()
	// MaxValue is the largest SET value (the data servers' --kv-max-value);
	// default 64 MiB. It replaces Limits.MaxValue.
	MaxValue   int64
	MaxClients int    // default 10000, as Redis
	Role       string // for INFO: "server <id>" or "gateway"
	// Memory, when set, reports the local KV tiers for INFO memory and
	// CONFIG GET maxmemory.
	Memory func() MemoryInfo
	// TLS, when set, serves RESP over TLS only (redis-cli --tls,
	// redis-py ssl=True); with ClientAuth set, clients need a certificate.
	TLS *tls.Config
	Log *slog.Logger
}

// handshakeTimeout bounds a TLS handshake on the RESP port.
const handshakeTimeout = 10 * time.Second

// MemoryInfo is what INFO memory reports.
type MemoryInfo struct {
	Used, Cap, DiskUsed, DiskCap int64
}

// Server serves Redis clients.
type Server struct {
	cfg     Config
	guesses *authlimit.Limiter // failed AUTH by address
	ln      *netguard.Listener // survives EMFILE; the client limit is ours (Redis's error text)
	ctx     context.Context
	cancel  context.CancelFunc
	start   time.Time
	onClose func() // releases what Attach or Gateway made

	prefetch    int           // what EXISTS prefetches (prefetch.go)
	prefetching chan struct{} // prefetches in flight

	mu     sync.Mutex
	conns  map[*conn]struct{}
	closed bool
	wg     sync.WaitGroup

	nextID                               atomic.Int64
	clients, connsTotal, cmds, rejected  atomic.Int64
	hits, misses, unreachable, bytesIn   atomic.Int64
	bytesOut, protoErrors, refusedValues atomic.Int64
	httpRefused                          atomic.Int64 // connections that spoke HTTP
	setsIntoDRAM                         atomic.Int64 // SET values read straight into the store's pages
}

// looksHTTP: the command is the start of an HTTP request: "POST" or
// "Host:" as a command (Redis closes on those two), or any inline line
// ending in an HTTP version ("GET / HTTP/1.1").
func looksHTTP(c *command) bool {
	name := strings.ToLower(string(c.args[0]))
	if name == "post" || name == "host:" {
		return true
	}
	return c.inline && len(c.args) == 3 && bytes.HasPrefix(c.args[2], []byte("HTTP/"))
}

// New listens on cfg.Listen; Serve serves.
func New(cfg Config) (*Server, error) {
	if cfg.Backend == nil {
		return nil, errors.New("resp: no backend")
	}
	if cfg.Limits == (Limits{}) {
		cfg.Limits = DefaultLimits()
	}
	if cfg.MaxValue > 0 {
		cfg.Limits.MaxValue = cfg.MaxValue
	}
	if cfg.Limits.MaxBulk < cfg.Limits.MaxValue {
		cfg.Limits.MaxBulk = cfg.Limits.MaxValue
	}
	if cfg.MaxClients <= 0 {
		cfg.MaxClients = 10000
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	if cfg.Role == "" {
		cfg.Role = "gateway"
	}
	ln, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		return nil, fmt.Errorf("resp: listen on %s: %w (is a Redis or another gd2fs using the port?)", cfg.Listen, err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	return &Server{cfg: cfg, guesses: authlimit.New("RESP", cfg.Log), ln: netguard.New(ln, 0, cfg.Log), ctx: ctx, cancel: cancel, start: time.Now(), conns: map[*conn]struct{}{},
		prefetching: make(chan struct{}, maxPrefetches)}, nil
}

// Addr is the listening address.
func (s *Server) Addr() string { return s.ln.Addr().String() }

// Serve accepts clients until ctx ends or Close is called.
func (s *Server) Serve(ctx context.Context) error {
	stop := context.AfterFunc(ctx, func() { s.Close() })
	defer stop()
	for {
		// Failures other than a close (out of file descriptors, say) are
		// retried with a backoff inside AcceptTracked, as on the data plane.
		nc, release, err := s.ln.AcceptTracked()
		if err != nil {
			s.mu.Lock()
			closed := s.closed
			s.mu.Unlock()
			if closed {
				return nil
			}
			return fmt.Errorf("resp: accept: %w", err)
		}
		s.connsTotal.Add(1)
		if s.cfg.TLS != nil {
			nc = tls.Server(nc, s.cfg.TLS) // the handshake runs in the connection's goroutine
		}
		c := newConn(s, nc)
		if !s.track(c, true) {
			nc.Close()
			release()
			continue
		}
		if s.clients.Add(1) > int64(s.cfg.MaxClients) {
			s.rejected.Add(1)
			nc.SetDeadline(time.Now().Add(time.Second)) // a TLS handshake must not hold the accept loop
			c.w.error("ERR max number of clients reached")
			c.w.flush()
			s.clients.Add(-1)
			s.track(c, false)
			nc.Close()
			release()
			continue
		}
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			defer release() // after serve closed the connection
			defer s.clients.Add(-1)
			defer s.track(c, false)
			if tc, ok := nc.(*tls.Conn); ok {
				tc.SetDeadline(time.Now().Add(handshakeTimeout))
				if err := tc.Handshake(); err != nil {
					s.cfg.Log.Debug("resp: TLS handshake", "remote", nc.RemoteAddr(), "err", err)
					nc.Close()
					return
				}
				tc.SetDeadline(time.Time{})
			}
			c.serve()
		}()
	}
}

func (s *Server) track(c *conn, on bool) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !on {
		delete(s.conns, c)
		return true
	}
	if s.closed {
		return false
	}
	s.conns[c] = struct{}{}
	return true
}

// Close stops accepting, closes every client connection and waits for
// their handlers.
func (s *Server) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	for c := range s.conns {
		c.nc.Close()
	}
	s.mu.Unlock()
	s.cancel()
	err := s.ln.Close()
	s.wg.Wait()
	if s.onClose != nil {
		s.onClose()
	}
	return err
}

// conn is one client.
type conn struct {
	s      *Server
	res    *kvstore.Reservation // the running SET's value, read into the store's pages (reader.direct)
	resCRC uint32
	nc     net.Conn
	r      *reader
	w      *writer
	id     int64
	authed bool
	name   string
	lib    [2]string // CLIENT SETINFO LIB-NAME, LIB-VER
	since  time.Time
	// multi holds the commands queued since MULTI (nil outside one);
	// multiErr: one of them was refused, EXEC will abort.
	multi    [][][]byte
	multiErr bool
}

func newConn(s *Server, nc net.Conn) *conn {
	c := &conn{s: s, nc: nc, r: newReader(nc, s.cfg.Limits), w: newWriter(nc), id: s.nextID.Add(1),
		authed: s.cfg.Token == "", since: time.Now()}
	c.r.authed = c.authed
	if rb, ok := s.cfg.Backend.(reserver); ok {
		c.r.direct = func(key []byte, n int64) *kvstore.Reservation {
			if !c.authed || c.multi != nil || keyError(key) != "" {
				return nil
			}
			res, err := rb.Reserve(s.ctx, key, n, true) // a plain SET replaces
			if err != nil {
				return nil // the ordinary path reads the value and answers the error
			}
			return res
		}
	}
	return c
}

func (c *conn) serve() {
	defer c.nc.Close()
	var cmd command
	defer cmd.release()
	for {
		err := c.r.next(&cmd)
		if err != nil {
			var pe protoError
			if errors.As(err, &pe) {
				c.s.protoErrors.Add(1)
				c.w.error("ERR " + pe.Error())
				c.w.flush()
			} else if !errors.Is(err, io.EOF) && !errors.Is(err, io.ErrUnexpectedEOF) && !errors.Is(err, net.ErrClosed) {
				c.s.cfg.Log.Debug("resp: read", "remote", c.nc.RemoteAddr(), "err", err)
			}
			return
		}
		if len(cmd.args) == 0 {
			continue
		}
		if looksHTTP(&cmd) {
			// As Redis does: a browser made to POST to this port (a web
			// page's cross-origin request) must not have its body run as
			// commands. The connection is closed without a reply.
			c.s.httpRefused.Add(1)
			c.s.cfg.Log.Warn("resp: an HTTP request reached the RESP port; connection closed (possible attack by a web page the user opened)", "remote", c.nc.RemoteAddr())
			return
		}
		c.s.cmds.Add(1)
		quit, err := c.exec(&cmd)
		if err != nil {
			return // the socket broke while a value was going out
		}
		// Flush once the pipeline is drained: a batch of commands costs
		// one write, a single command is answered at once. After a large
		// argument flush anyway: reading it cost far more than a write,
		// and a client pipelining big SETs sees its replies as they come.
		if quit || c.r.br.Buffered() == 0 || len(cmd.bufs) > 0 || cmd.res != nil || cmd.skipped > 0 {
			if err := c.w.flush(); err != nil || quit {
				return
			}
		}
	}
}
