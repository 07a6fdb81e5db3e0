package frames

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sync"
	"time"
)

// ErrNotUsed: no framed connection to this master now (it answered the
// upgrade with something other than 101, lately, or the call cannot be
// framed): send the call as plain HTTP.
var ErrNotUsed = errors.New("frames: not used for this call")

// Client keeps framed connections to masters, each used by one call at a
// time, and sends calls on them.
type Client struct {
	// Transport makes the upgrade request: it dials and speaks TLS as for
	// plain calls.
	Transport http.RoundTripper
	// Header goes with the upgrade (the token, the caller's role); the
	// master applies it to every call on the connection.
	Header http.Header
	// MaxIdle bounds the idle connections kept to one master (default
	// DefaultMaxIdle); IdleFor is how long one may wait unused before it
	// is closed rather than used (default DefaultIdleFor, under the
	// master's idle timeout of two minutes); Retry how long calls to a
	// master that refused an upgrade go as plain HTTP before another
	// upgrade is tried (default DefaultRetry).
	MaxIdle int
	IdleFor time.Duration
	Retry   time.Duration

	mu   sync.Mutex
	idle map[string][]*cconn
	off  map[string]time.Time
}

// Defaults of Client.
const (
	DefaultMaxIdle = 64
	DefaultIdleFor = time.Minute
	DefaultRetry   = 30 * time.Second
	// upgradeTimeout bounds the upgrade's round trip.
	upgradeTimeout = 10 * time.Second
)

// cconn is one framed connection of a client.
type cconn struct {
	rwc  io.ReadWriteCloser
	br   *bufio.Reader
	last time.Time // when it was last put back
}

// Do sends one call to base (a master's URL) on a framed connection and
// returns its answer, whose Body is the caller's. replay says the call
// may be sent twice: then a call on a kept connection that the master had
// closed meanwhile (its idle timeout) is sent again on a new one.
//
// ErrNotUsed: send the call as plain HTTP. Any other error is a transport
// error: the upgrade's (a dial error that net/http returns as such) or
// the connection's, after which the call may or may not have been
// applied.
func (c *Client) Do(ctx context.Context, base, method, path string, h http.Header, body []byte, replay bool) (Answer, error) {
	if c.isOff(base) {
		return Answer{}, ErrNotUsed
	}
	frame, err := AppendRequest(nil, method, path, h, body)
	if err != nil {
		return Answer{}, fmt.Errorf("%w: %v", ErrNotUsed, err)
	}
	for attempt := 0; ; attempt++ {
		cc, reused, err := c.get(ctx, base)
		if err != nil {
			return Answer{}, err
		}
		a, keep, sent, err := cc.call(ctx, frame)
		if err == nil {
			if keep {
				c.put(base, cc)
			} else {
				cc.rwc.Close()
			}
			return a, nil
		}
		cc.rwc.Close()
		if ctx.Err() != nil {
			return Answer{}, ctx.Err()
		}
		if reused && !sent && replay && attempt == 0 {
			continue // the master closed it while it was idle
		}
		return Answer{}, fmt.Errorf("framed connection to %s: %w", base, err)
	}
}

// call writes frame and reads its answer. sent is false when the
// connection failed before any byte of an answer came (it may have been
// closed by the master before the frame reached it).
func (cc *cconn) call(ctx context.Context, frame []byte) (a Answer, keep, sent bool, err error) {
	stop := context.AfterFunc(ctx, func() { cc.rwc.Close() })
	defer func() {
		if !stop() {
			keep = false // the context ended: the connection is closed
		}
	}()
	if _, err := cc.rwc.Write(frame); err != nil {
		return a, false, false, err
	}
	var pre [4]byte
	if _, err := io.ReadFull(cc.br, pre[:1]); err != nil {
		return a, false, false, err
	}
	if _, err := io.ReadFull(cc.br, pre[1:]); err != nil {
		return a, false, true, err
	}
	n, err := Length(pre, MaxAnswer)
	if err != nil {
		return a, false, true, err
	}
	b := make([]byte, n)
	if _, err := io.ReadFull(cc.br, b); err != nil {
		return a, false, true, err
	}
	if a, err = ParseAnswer(b); err != nil {
		return a, false, true, err
	}
	return a, !headerHas(a.Header, "Connection", "close"), true, nil
}

func (c *Client) isOff(base string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	t, ok := c.off[base]
	if ok && time.Now().After(t) {
		delete(c.off, base)
		return false
	}
	return ok
}

// get takes an idle connection to base, or upgrades a new one.
func (c *Client) get(ctx context.Context, base string) (*cconn, bool, error) {
	idleFor := c.IdleFor
	if idleFor <= 0 {
		idleFor = DefaultIdleFor
	}
	now := time.Now()
	c.mu.Lock()
	for l := c.idle[base]; len(l) > 0; l = c.idle[base] {
		cc := l[len(l)-1]
		c.idle[base] = l[:len(l)-1]
		if now.Sub(cc.last) < idleFor {
			c.mu.Unlock()
			return cc, true, nil
		}
		cc.rwc.Close()
	}
	c.mu.Unlock()
	cc, err := c.upgrade(ctx, base)
	return cc, false, err
}

func (c *Client) put(base string, cc *cconn) {
	max := c.MaxIdle
	if max <= 0 {
		max = DefaultMaxIdle
	}
	cc.last = time.Now()
	c.mu.Lock()
	if c.idle == nil {
		c.idle = map[string][]*cconn{}
	}
	if len(c.idle[base]) < max {
		c.idle[base] = append(c.idle[base], cc)
		cc = nil
	}
	c.mu.Unlock()
	if cc != nil {
		cc.rwc.Close()
	}
}

// upgrade opens a framed connection to base.
func (c *Client) upgrade(ctx context.Context, base string) (*cconn, error) {
	uctx, cancel := context.WithTimeout(ctx, upgradeTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(uctx, http.MethodGet, base+Path, nil)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrNotUsed, err)
	}
	for k, vs := range c.Header {
		req.Header[k] = vs
	}
	req.Header.Set("Connection", "Upgrade")
	req.Header.Set("Upgrade", Protocol)
	tr := c.Transport
	if tr == nil {
		tr = http.DefaultTransport
	}
	resp, err := tr.RoundTrip(req)
	if err != nil {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return nil, err
	}
	rwc, ok := resp.Body.(io.ReadWriteCloser)
	if resp.StatusCode != http.StatusSwitchingProtocols || !ok || !headerHas(resp.Header, "Upgrade", Protocol) {
		// An older master (404), a standby (503), a proxy that does not
		// pass upgrades: plain HTTP for a while; the plain call finds out
		// the rest.
		io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
		resp.Body.Close()
		retry := c.Retry
		if retry <= 0 {
			retry = DefaultRetry
		}
		c.mu.Lock()
		if c.off == nil {
			c.off = map[string]time.Time{}
		}
		c.off[base] = time.Now().Add(retry)
		c.mu.Unlock()
		return nil, fmt.Errorf("%w: %s answered the upgrade %s", ErrNotUsed, base, resp.Status)
	}
	return &cconn{rwc: rwc, br: bufio.NewReaderSize(rwc, 16<<10)}, nil
}

// Close closes the idle connections; calls in flight keep theirs until
// they end.
func (c *Client) Close() {
	c.mu.Lock()
	idle := c.idle
	c.idle = nil
	c.mu.Unlock()
	for _, l := range idle {
		for _, cc := range l {
			cc.rwc.Close()
		}
	}
}
