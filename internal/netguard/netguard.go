// Package netguard wraps a listener so that a flood of connections cannot
// take a server down: at most Max connections are open at once (those past
// it are closed at once and counted), and Accept survives resource errors
// such as EMFILE (too many open files) by backing off and trying again,
// instead of returning them and ending the caller's accept loop for good.
// Err tells a health check whether accepting currently fails.
package netguard

import (
	"errors"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// Listener is a guarded net.Listener. Accept returns an error only once the
// underlying listener is closed.
type Listener struct {
	net.Listener
	max  int
	log  *slog.Logger
	open atomic.Int64

	// Rejected counts connections closed because Max were open; Failures
	// counts accept errors (each retried after a backoff).
	Rejected, Failures atomic.Int64

	mu      sync.Mutex
	lastErr error // the last accept error, until an accept succeeds
	closed  atomic.Bool
}

// New guards ln. max <= 0 means no connection limit; log may be nil.
func New(ln net.Listener, max int, log *slog.Logger) *Listener {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Listener{Listener: ln, max: max, log: log}
}

// Open is the number of accepted connections not yet closed.
func (l *Listener) Open() int64 { return l.open.Load() }

// Err is the last accept error while accepting fails, nil once an accept
// succeeds again: a server reports itself unhealthy while it is non-nil.
func (l *Listener) Err() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.lastErr
}

// Close closes the listener; a blocked Accept returns.
func (l *Listener) Close() error {
	l.closed.Store(true)
	return l.Listener.Close()
}

// Accept waits for the next connection within the limit; closing the
// returned connection gives its slot back.
func (l *Listener) Accept() (net.Conn, error) {
	c, release, err := l.AcceptTracked()
	if err != nil {
		return nil, err
	}
	return &conn{Conn: c, release: release}, nil
}

// AcceptTracked is Accept for a hot path: it returns the connection as the
// listener made it (a *net.TCPConn keeps its writev path), and the caller
// calls release exactly once after closing it. Errors other than the
// listener being closed are retried with a backoff of 5 ms doubling to 1 s
// (as net/http does), logged once per run of failures.
func (l *Listener) AcceptTracked() (net.Conn, func(), error) {
	var delay time.Duration
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			if l.closed.Load() || errors.Is(err, net.ErrClosed) {
				return nil, nil, err
			}
			l.Failures.Add(1)
			l.mu.Lock()
			first := l.lastErr == nil
			l.lastErr = err
			l.mu.Unlock()
			if first {
				l.log.Error("accept failing; retrying with backoff", "addr", l.Addr(), "err", err)
			}
			if delay == 0 {
				delay = 5 * time.Millisecond
			} else {
				delay = min(2*delay, time.Second)
			}
			time.Sleep(delay)
			continue
		}
		delay = 0
		l.mu.Lock()
		if l.lastErr != nil {
			l.log.Info("accepting again", "addr", l.Addr())
			l.lastErr = nil
		}
		l.mu.Unlock()
		if l.max > 0 && l.open.Load() >= int64(l.max) {
			l.Rejected.Add(1)
			c.Close()
			continue
		}
		l.open.Add(1)
		var once sync.Once
		return c, func() { once.Do(func() { l.open.Add(-1) }) }, nil
	}
}

// conn gives its slot back on Close.
type conn struct {
	net.Conn
	release func()
}

func (c *conn) Close() error {
	err := c.Conn.Close()
	c.release()
	return err
}
