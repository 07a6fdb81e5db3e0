// Package connpool keeps idle client connections that one goroutine at a
// time writes a call on and reads its answer from: the framed connections
// to a master (internal/frames) and the router's HTTP/1.1 connections to
// its engine (internal/router). net/http's Transport hands every request
// to a connection's writer goroutine and its answer back from a reader
// goroutine; on a VM where a wake-up costs tens of microseconds, those
// hand-offs were a large part of a call between idle processes
// (docs/benchmarks.md, "Eighteenth session"). A caller of this package
// writes and reads on its own goroutine instead.
package connpool

import (
	"bufio"
	"context"
	"crypto/tls"
	"net"
	"net/http"
	"net/url"
	"sync"
	"time"
)

// Conn is one kept connection: its reader buffers what the peer sent.
type Conn struct {
	NC net.Conn
	BR *bufio.Reader
	// Tag is what the peer said of itself when the connection was made
	// (frames: the calls its master takes beyond explicit sessions').
	Tag  string
	last time.Time // when it was last put back
}

// Pool holds idle connections by key (a peer's base URL). The zero Pool is
// ready; it takes its bounds with each Get and Put, so a caller's settings
// may be set after it was made.
type Pool struct {
	mu     sync.Mutex
	idle   map[string][]*Conn // the oldest first
	closed bool
}

// Get takes an idle connection to key that is still open and was put back
// less than idleFor ago (the newest first), or returns nil. Stale and
// closed ones are closed on the way.
func (p *Pool) Get(key string, idleFor time.Duration) *Conn {
	for {
		p.mu.Lock()
		stale := p.sweep(key, idleFor)
		var c *Conn
		if l := p.idle[key]; len(l) > 0 {
			c = l[len(l)-1]
			p.idle[key] = l[:len(l)-1]
		}
		p.mu.Unlock()
		for _, s := range stale {
			s.NC.Close()
		}
		if c == nil {
			return nil
		}
		if c.BR.Buffered() == 0 && Open(c.NC) {
			return c
		}
		c.NC.Close() // the peer closed it (or sent something) while it was idle
	}
}

// Put gives c back to the pool of key, or closes it when the pool is
// closed or already holds max idle connections to key.
func (p *Pool) Put(key string, c *Conn, max int, idleFor time.Duration) {
	c.last = time.Now()
	p.mu.Lock()
	if p.idle == nil {
		p.idle = map[string][]*Conn{}
	}
	stale := p.sweep(key, idleFor)
	if !p.closed && len(p.idle[key]) < max {
		p.idle[key] = append(p.idle[key], c)
		c = nil
	}
	p.mu.Unlock()
	for _, s := range stale {
		s.NC.Close()
	}
	if c != nil {
		c.NC.Close()
	}
}

// sweep takes the connections to key idle for longer than idleFor out of
// the pool and returns them; p.mu is held.
func (p *Pool) sweep(key string, idleFor time.Duration) []*Conn {
	l := p.idle[key]
	cut := time.Now().Add(-idleFor)
	i := 0
	for i < len(l) && l[i].last.Before(cut) {
		i++
	}
	if i == 0 {
		return nil
	}
	stale := append([]*Conn(nil), l[:i]...)
	p.idle[key] = append(l[:0], l[i:]...)
	return stale
}

// Close closes the idle connections, and any put back later.
func (p *Pool) Close() {
	p.mu.Lock()
	idle := p.idle
	p.idle = nil
	p.closed = true
	p.mu.Unlock()
	for _, l := range idle {
		for _, c := range l {
			c.NC.Close()
		}
	}
}

// Dial connects to u's host as tr would: its DialContext (or a plain
// dialer), then for https a TLS handshake with its TLSClientConfig,
// offering only HTTP/1.1 (what a Conn speaks). timeout bounds both.
func Dial(ctx context.Context, tr *http.Transport, u *url.URL, timeout time.Duration) (net.Conn, error) {
	host, port := u.Hostname(), u.Port()
	if port == "" {
		port = "80"
		if u.Scheme == "https" {
			port = "443"
		}
	}
	addr := net.JoinHostPort(host, port)
	dctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	d := tr.DialContext
	if d == nil {
		d = (&net.Dialer{}).DialContext
	}
	nc, err := d(dctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	if u.Scheme != "https" {
		return nc, nil
	}
	cfg := &tls.Config{}
	if tr.TLSClientConfig != nil {
		cfg = tr.TLSClientConfig.Clone()
	}
	if cfg.ServerName == "" {
		cfg.ServerName = host
	}
	cfg.NextProtos = []string{"http/1.1"}
	tc := tls.Client(nc, cfg)
	if err := tc.HandshakeContext(dctx); err != nil {
		nc.Close()
		return nil, err
	}
	return tc, nil
}
