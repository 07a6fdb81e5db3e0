package frames

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/net/http/httpguts"
)

// Server serves framed connections.
type Server struct {
	// Allow, when set, says which calls a frame may carry; any other is
	// answered 400 (send it as plain HTTP), so that what reaches the
	// handler through frames is only what the clients send that way.
	Allow func(method, path string) bool
	// Takes names, in the upgrade's answer (TakesHeader), the families of
	// calls beyond explicit sessions' that Allow lets through (CallCommit),
	// so that clients send them framed.
	Takes []string
	// Idle bounds the wait for a connection's next frame; Read the read
	// of a frame once its length has come; Write the write of an answer.
	Idle, Read, Write time.Duration
	Log               *slog.Logger

	mu     sync.Mutex
	conns  map[net.Conn]context.CancelFunc
	closed bool
	open   atomic.Int64
	calls  atomic.Int64
}

// Open is the number of framed connections being served; Calls the calls
// answered on them.
func (s *Server) Open() int64  { return s.open.Load() }
func (s *Server) Calls() int64 { return s.calls.Load() }

// IsUpgrade reports whether r asks for a framed connection.
func IsUpgrade(r *http.Request) bool {
	return r.Method == http.MethodGet && headerHas(r.Header, "Connection", "upgrade") && headerHas(r.Header, "Upgrade", Protocol)
}

// headerHas: one of h's name headers lists token (case aside).
func headerHas(h http.Header, name, token string) bool {
	return httpguts.HeaderValuesContainsToken(h.Values(name), token)
}

// Upgrade answers r, a GET Path with Upgrade: Protocol that has passed
// the caller's checks, with 101 Switching Protocols, and serves frames on
// its connection until the client closes it, a read times out, a frame
// does not parse, an answer says Connection: close, or Close. Every frame
// is answered by h (the server's handler of plain requests, so that a framed
// call passes what a plain one does) with a request that has r's Host, RemoteAddr,
// TLS state, context values and headers (but Upgrade and Connection),
// overlaid by the frame's own headers.
func (s *Server) Upgrade(w http.ResponseWriter, r *http.Request, h http.Handler) {
	if !IsUpgrade(r) {
		http.Error(w, fmt.Sprintf("%s takes GET with Connection: Upgrade and Upgrade: %s", Path, Protocol), http.StatusBadRequest)
		return
	}
	hj, ok := w.(http.Hijacker)
	if !ok {
		http.Error(w, "this connection cannot be upgraded (HTTP/2, or a framed call): use HTTP/1.1", http.StatusBadRequest)
		return
	}
	nc, brw, err := hj.Hijack()
	if err != nil {
		return
	}
	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		nc.Close()
		return
	}
	if s.conns == nil {
		s.conns = map[net.Conn]context.CancelFunc{}
	}
	s.conns[nc] = cancel
	s.mu.Unlock()
	s.open.Add(1)
	defer func() {
		s.mu.Lock()
		delete(s.conns, nc)
		s.mu.Unlock()
		s.open.Add(-1)
		nc.Close()
	}()
	nc.SetDeadline(time.Time{}) // the server's deadlines were for the upgrade
	brw.WriteString("HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: " + Protocol + "\r\n")
	if len(s.Takes) > 0 {
		brw.WriteString(TakesHeader + ": " + strings.Join(s.Takes, ", ") + "\r\n")
	}
	brw.WriteString("\r\n")
	if brw.Flush() != nil {
		return
	}
	c := &sconn{s: s, h: h, nc: nc, br: brw.Reader, bw: brw.Writer, ctx: ctx, up: r}
	c.base = r.Header.Clone()
	c.base.Del("Connection")
	c.base.Del("Upgrade")
	c.base.Del("Accept-Encoding") // answers go as the handler writes them
	c.base.Del("Content-Length")
	c.serve()
}

// Close closes every framed connection; their handlers in progress see
// their contexts end.
func (s *Server) Close() {
	s.mu.Lock()
	s.closed = true
	for c, cancel := range s.conns {
		c.Close() // first, so that no answer goes out after it
		cancel()
	}
	s.mu.Unlock()
}

// sconn is one framed connection.
type sconn struct {
	s    *Server
	h    http.Handler
	nc   net.Conn
	br   *bufio.Reader
	bw   *bufio.Writer
	ctx  context.Context
	up   *http.Request
	base http.Header
	rw   respWriter
	head []byte // an answer's length, status and headers
}

// bufs hold a frame being answered and its answer while the call runs; an
// idle connection holds none.
var bufs = sync.Pool{New: func() any { return new(bytes.Buffer) }}

func getBuf() *bytes.Buffer { return bufs.Get().(*bytes.Buffer) }

func putBuf(b *bytes.Buffer) {
	if b.Cap() <= 1<<20 {
		b.Reset()
		bufs.Put(b)
	}
}

func (c *sconn) serve() {
	for {
		if c.s.Idle > 0 {
			c.nc.SetReadDeadline(time.Now().Add(c.s.Idle))
		}
		var pre [4]byte
		if _, err := io.ReadFull(c.br, pre[:]); err != nil {
			return // closed, or idle too long
		}
		n, err := Length(pre, MaxRequest)
		if err != nil {
			c.logf("frames: closing a connection from %s: %v", c.up.RemoteAddr, err)
			return
		}
		if c.s.Read > 0 {
			c.nc.SetReadDeadline(time.Now().Add(c.s.Read))
		}
		in := getBuf()
		// Room as the bytes come, not as the length claims: a client
		// that announces 4 MiB and sends nothing holds 64 KiB.
		in.Grow(min(n, 64<<10))
		if _, err := in.ReadFrom(io.LimitReader(c.br, int64(n))); err != nil || in.Len() != n {
			putBuf(in)
			return
		}
		fr, err := ParseRequest(in.Bytes())
		if err != nil {
			putBuf(in)
			c.logf("frames: closing a connection from %s: %v", c.up.RemoteAddr, err)
			return
		}
		keep := c.answer(fr)
		putBuf(in)
		if !keep {
			return
		}
	}
}

// answer runs the handler on fr and writes its answer; false when the
// connection is to close.
func (c *sconn) answer(fr Request) (keep bool) {
	c.s.calls.Add(1)
	c.rw.reset()
	defer func() {
		if c.rw.body != nil {
			putBuf(c.rw.body)
			c.rw.body = nil
		}
	}()
	u, err := url.ParseRequestURI(fr.Path)
	switch {
	case err != nil:
		c.logf("frames: closing a connection from %s: path %.64q: %v", c.up.RemoteAddr, fr.Path, err)
		return false
	case c.s.Allow != nil && !c.s.Allow(fr.Method, u.Path):
		c.rw.refuse(http.StatusBadRequest, fmt.Sprintf("%s %s is not taken on a framed connection: send it as plain HTTP", fr.Method, u.Path))
	default:
		c.serveHTTP(fr, u)
	}
	status := c.rw.status
	if status == 0 {
		status = http.StatusOK
	}
	if c.rw.over {
		status = http.StatusInternalServerError
		c.rw.refuse(status, "the answer is too large for a framed connection: send the call as plain HTTP")
	}
	head, err := appendAnswerHead(c.head[:0], status, c.rw.h, c.rw.body.Len())
	c.head = head
	if err != nil {
		c.logf("frames: %s %s: %v", fr.Method, fr.Path, err)
		return false
	}
	if c.s.Write > 0 {
		c.nc.SetWriteDeadline(time.Now().Add(c.s.Write))
	}
	c.bw.Write(head)
	c.bw.Write(c.rw.body.Bytes())
	if c.bw.Flush() != nil {
		return false
	}
	return !headerHas(c.rw.h, "Connection", "close")
}

// serveHTTP runs the handler on fr as a request of the upgraded
// connection.
func (c *sconn) serveHTTP(fr Request, u *url.URL) {
	h := c.base.Clone()
	for k, vs := range fr.Header {
		h[k] = vs
	}
	h.Del("Content-Length") // the frame's length says it
	req := &http.Request{
		Method: fr.Method, URL: u, Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
		Header: h, Body: http.NoBody, ContentLength: int64(len(fr.Body)),
		Host: c.up.Host, RemoteAddr: c.up.RemoteAddr, RequestURI: fr.Path, TLS: c.up.TLS,
	}
	if len(fr.Body) > 0 {
		req.Body = io.NopCloser(bytes.NewReader(fr.Body))
	}
	req = req.WithContext(c.ctx)
	defer func() {
		if v := recover(); v != nil {
			if v == http.ErrAbortHandler {
				panic(v)
			}
			c.logf("frames: handler of %s %s panicked: %v", fr.Method, fr.Path, v)
			c.rw.refuse(http.StatusInternalServerError, "internal error")
		}
	}()
	c.h.ServeHTTP(&c.rw, req)
}

func (c *sconn) logf(format string, args ...any) {
	if c.s.Log != nil {
		c.s.Log.Warn(fmt.Sprintf(format, args...))
	}
}

// respWriter collects a handler's answer.
type respWriter struct {
	h      http.Header
	status int
	body   *bytes.Buffer
	over   bool // the handler wrote more than MaxAnswer allows
}

func (w *respWriter) reset() {
	w.h = http.Header{}
	w.status = 0
	w.body = getBuf()
	w.over = false
}

// refuse replaces whatever was written with an error answer in the
// master's form.
func (w *respWriter) refuse(status int, msg string) {
	code := "bad_request"
	if status >= 500 {
		code = "internal"
	}
	w.h = http.Header{"Content-Type": {"application/json"}}
	w.status = status
	w.body.Reset()
	fmt.Fprintf(w.body, "{\"error\":%q,\"code\":%q}\n", msg, code)
}

func (w *respWriter) Header() http.Header { return w.h }

func (w *respWriter) WriteHeader(code int) {
	if w.status == 0 && code >= 200 { // 1xx are informational: not sent here
		w.status = code
	}
}

func (w *respWriter) Write(b []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	if w.over || w.body.Len()+len(b) > MaxAnswer-64<<10 {
		w.over = true
		return 0, errAnswerTooLarge
	}
	return w.body.Write(b)
}

// Flush is a no-op: the answer goes whole when the handler returns.
func (w *respWriter) Flush() {}

var errAnswerTooLarge = errors.New("frames: answer too large for a framed connection")
