// Package netguard wraps a listener so that a flood of connections cannot
// take a server down: at most Max connections are open at once (those past
// it are closed at once and counted), and Accept survives resource errors
// such as EMFILE (too many open files) by backing off and trying again,
// instead of returning them and ending the caller's accept loop for good.
// Err tells a health check whether accepting currently fails.
//
// With Protect, connections that have not authenticated yet (the caller
// says when one has: Authenticated) are the first to go: when the limit is
// reached the oldest of them is closed to make room, one address holds at
// most PerIP of them, and, on connections from Accept, their read deadlines
// are cut to PreAuth. So idle or silent sockets opened by anyone who can
// reach the port cannot lock out a client that holds the token.
package netguard

import (
	"container/list"
	"crypto/tls"
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

	// Evicted counts unauthenticated connections closed to make room
	// (Protect).
	Evicted atomic.Int64

	mu      sync.Mutex
	lastErr error // the last accept error, until an accept succeeds
	closed  atomic.Bool

	// Protect's state, under pmu: every unauthenticated connection in
	// accept order, overall and by remote address.
	perIP   int
	preAuth time.Duration
	pmu     sync.Mutex
	slots   map[net.Conn]*slot // by the connection as accepted
	unauth  list.List          // of *slot
	byIP    map[string]*list.List
}

// slot is one accepted connection under Protect.
type slot struct {
	c         net.Conn
	ip        string
	all, mine *list.Element // in unauth and byIP[ip]; nil once authenticated
	authed    atomic.Bool
	w         *conn // the wrapper Accept returned, nil for AcceptTracked
}

// Protect turns on the eviction of unauthenticated connections: perIP
// bounds those of one remote address (0: no bound), preAuth their read
// deadlines on connections from Accept (0: as the server sets them). Call
// it before the first Accept.
func (l *Listener) Protect(perIP int, preAuth time.Duration) *Listener {
	l.perIP, l.preAuth = perIP, preAuth
	l.slots = map[net.Conn]*slot{}
	l.byIP = map[string]*list.List{}
	return l
}

// Authenticated marks a connection as having authenticated: it is no longer
// evicted, and its deadlines are as the server sets them. c is the
// connection Accept or AcceptTracked returned, or a *tls.Conn over it.
func (l *Listener) Authenticated(c net.Conn) {
	if l.slots == nil {
		return
	}
	if tc, ok := c.(*tls.Conn); ok {
		c = tc.NetConn()
	}
	if w, ok := c.(*conn); ok {
		c = w.Conn
	}
	l.pmu.Lock()
	sl := l.slots[c]
	if sl == nil || sl.authed.Load() {
		l.pmu.Unlock()
		return
	}
	l.unlink(sl)
	sl.authed.Store(true)
	w := sl.w
	l.pmu.Unlock()
	if w != nil {
		w.restore()
	}
}

// unlink takes sl out of the unauthenticated lists; pmu held.
func (l *Listener) unlink(sl *slot) {
	if sl.all != nil {
		l.unauth.Remove(sl.all)
		sl.all = nil
	}
	if sl.mine != nil {
		if q := l.byIP[sl.ip]; q != nil {
			q.Remove(sl.mine)
			if q.Len() == 0 {
				delete(l.byIP, sl.ip)
			}
		}
		sl.mine = nil
	}
}

// admit registers a new connection under Protect, closing the oldest
// unauthenticated ones it displaces. It reports false when there is no room
// (the limit is reached and every connection has authenticated).
func (l *Listener) admit(c net.Conn) (*slot, bool) {
	ip := ""
	if a, ok := c.RemoteAddr().(*net.TCPAddr); ok {
		ip = a.IP.String()
	}
	var victims []net.Conn
	l.pmu.Lock()
	if l.perIP > 0 {
		if q := l.byIP[ip]; q != nil && q.Len() >= l.perIP {
			old := q.Front().Value.(*slot)
			l.unlink(old)
			victims = append(victims, old.c)
		}
	}
	if l.max > 0 && l.open.Load()-int64(len(victims)) >= int64(l.max) {
		e := l.unauth.Front()
		if e == nil {
			l.pmu.Unlock()
			return nil, false
		}
		old := e.Value.(*slot)
		l.unlink(old)
		victims = append(victims, old.c)
	}
	sl := &slot{c: c, ip: ip}
	sl.all = l.unauth.PushBack(sl)
	q := l.byIP[ip]
	if q == nil {
		q = list.New()
		l.byIP[ip] = q
	}
	sl.mine = q.PushBack(sl)
	l.slots[c] = sl
	l.pmu.Unlock()
	for _, v := range victims {
		l.Evicted.Add(1)
		v.Close() // its owner sees the close and releases the slot
	}
	return sl, true
}

// forget drops a closed connection's slot.
func (l *Listener) forget(sl *slot) {
	l.pmu.Lock()
	l.unlink(sl)
	delete(l.slots, sl.c)
	l.pmu.Unlock()
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
	c, sl, release, err := l.accept()
	if err != nil {
		return nil, err
	}
	w := &conn{Conn: c, release: release, l: l, sl: sl}
	if sl != nil {
		l.pmu.Lock()
		sl.w = w
		l.pmu.Unlock()
		if l.preAuth > 0 {
			c.SetReadDeadline(time.Now().Add(l.preAuth))
		}
	}
	return w, nil
}

// AcceptTracked is Accept for a hot path: it returns the connection as the
// listener made it (a *net.TCPConn keeps its writev path), and the caller
// calls release exactly once after closing it. Errors other than the
// listener being closed are retried with a backoff of 5 ms doubling to 1 s
// (as net/http does), logged once per run of failures.
func (l *Listener) AcceptTracked() (net.Conn, func(), error) {
	c, _, release, err := l.accept()
	return c, release, err
}

func (l *Listener) accept() (net.Conn, *slot, func(), error) {
	var delay time.Duration
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			if l.closed.Load() || errors.Is(err, net.ErrClosed) {
				return nil, nil, nil, err
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
		var sl *slot
		if l.slots != nil {
			ok := false
			if sl, ok = l.admit(c); !ok {
				l.Rejected.Add(1)
				c.Close()
				continue
			}
		} else if l.max > 0 && l.open.Load() >= int64(l.max) {
			l.Rejected.Add(1)
			c.Close()
			continue
		}
		l.open.Add(1)
		var once sync.Once
		return c, sl, func() {
			once.Do(func() {
				if sl != nil {
					l.forget(sl)
				}
				l.open.Add(-1)
			})
		}, nil
	}
}

// conn gives its slot back on Close; under Protect it keeps read deadlines
// within PreAuth until it has authenticated.
type conn struct {
	net.Conn
	release func()
	l       *Listener
	sl      *slot

	mu     sync.Mutex
	want   time.Time // the read deadline the server asked for
	wanted bool
}

func (c *conn) cut() bool {
	return c.sl != nil && c.l.preAuth > 0 && !c.sl.authed.Load()
}

// clamp is d, or sooner: within PreAuth from now.
func (c *conn) clamp(d time.Time) time.Time {
	lim := time.Now().Add(c.l.preAuth)
	if d.IsZero() || d.After(lim) {
		return lim
	}
	return d
}

func (c *conn) SetReadDeadline(d time.Time) error {
	c.mu.Lock()
	c.want, c.wanted = d, true
	c.mu.Unlock()
	if c.cut() {
		d = c.clamp(d)
	}
	return c.Conn.SetReadDeadline(d)
}

func (c *conn) SetDeadline(d time.Time) error {
	if !c.cut() {
		c.mu.Lock()
		c.want, c.wanted = d, true
		c.mu.Unlock()
		return c.Conn.SetDeadline(d)
	}
	if err := c.Conn.SetWriteDeadline(d); err != nil {
		return err
	}
	return c.SetReadDeadline(d)
}

// restore puts back the read deadline the server asked for, once the
// connection has authenticated.
func (c *conn) restore() {
	c.mu.Lock()
	d, ok := c.want, c.wanted
	c.mu.Unlock()
	if ok {
		c.Conn.SetReadDeadline(d)
	} else {
		c.Conn.SetReadDeadline(time.Time{})
	}
}

func (c *conn) Close() error {
	err := c.Conn.Close()
	c.release()
	return err
}
