package frames

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/gd2fs/gd2fs/internal/connpool"
	"golang.org/x/net/http/httpguts"
)

// ErrNotUsed: no framed connection to this master now (it answered the
// upgrade with something other than 101, lately; the transport goes
// through a proxy; or the call cannot be framed): send the call as plain
// HTTP.
var ErrNotUsed = errors.New("frames: not used for this call")

// ErrNotSent marks an error before any byte of the call was written (the
// dial, TLS, or the upgrade failed): the master surely did not apply it.
var ErrNotSent = errors.New("the call was not sent")

// Client keeps framed connections to masters, each used by one call at a
// time, and sends calls on them.
type Client struct {
	// Transport is the plain calls' transport: its dialer, TLS settings
	// and proxy rule are used for the framed connections (a transport
	// that goes through a proxy gets none). Nil: http.DefaultTransport's.
	Transport *http.Transport
	// Header goes with the upgrade (the token, the caller's role); the
	// master applies it to every call on the connection.
	Header http.Header
	// MaxIdle bounds the idle connections kept to one master (default
	// DefaultMaxIdle); IdleFor is how long one may wait unused before it
	// is closed rather than used (default DefaultIdleFor, under the
	// master's idle timeout of two minutes); Retry how long calls to a
	// master that refused an upgrade go as plain HTTP before another
	// upgrade is tried (default DefaultRetry; a standby's 503, which may
	// lead soon, at most DefaultRetryStandby).
	MaxIdle int
	IdleFor time.Duration
	Retry   time.Duration

	pool connpool.Pool
	mu   sync.Mutex
	off  map[string]time.Time
	// tags: what each master's last upgrade named in TakesHeader, so a
	// call it does not take costs no upgrade to find out.
	tags map[string]string
}

// Defaults of Client.
const (
	DefaultMaxIdle      = 64
	DefaultIdleFor      = time.Minute
	DefaultRetry        = 30 * time.Second
	DefaultRetryStandby = 2 * time.Second
	// upgradeTimeout bounds the dial, TLS handshake and upgrade.
	upgradeTimeout = 10 * time.Second
)

// frameBufs hold request frames while they are written: a call's frame is
// done with when Do returns.
var frameBufs = sync.Pool{New: func() any { b := make([]byte, 0, 4<<10); return &b }}

// Do sends one call to base (a master's URL) on a framed connection and
// returns its answer, whose Body is the caller's. replay says the call
// may be sent twice: then a call on a kept connection that failed before
// any byte of an answer came is sent again on a new one.
//
// ErrNotUsed: send the call as plain HTTP. Any other error is a transport
// error; with ErrNotSent the call was surely not applied, else it may or
// may not have been.
func (c *Client) Do(ctx context.Context, base, method, path string, h http.Header, body []byte, replay bool) (Answer, error) {
	if c.isOff(base) {
		return Answer{}, ErrNotUsed
	}
	fb := frameBufs.Get().(*[]byte)
	frame, err := AppendRequest((*fb)[:0], method, path, h, body)
	defer func() {
		if cap(frame) <= 1<<20 { // a large request's buffer is not kept
			*fb = frame[:0]
			frameBufs.Put(fb)
		}
	}()
	if err != nil {
		return Answer{}, fmt.Errorf("%w: %v", ErrNotUsed, err)
	}
	need := family(method, path)
	if need != "" {
		c.mu.Lock()
		tag, known := c.tags[base]
		c.mu.Unlock()
		if known && !takes(tag, need) {
			return Answer{}, fmt.Errorf("%w: %s does not take %s on a framed connection", ErrNotUsed, base, need)
		}
	}
	for attempt := 0; ; attempt++ {
		cc, reused, err := c.get(ctx, base)
		if err != nil {
			return Answer{}, err
		}
		if need != "" && !takes(cc.Tag, need) {
			// A master that does not take the call on frames: plain HTTP
			// (the connection stays for the calls it takes).
			c.pool.Put(base, cc, c.maxIdle(), c.idleFor())
			return Answer{}, fmt.Errorf("%w: %s does not take %s on a framed connection", ErrNotUsed, base, need)
		}
		a, keep, sent, err := call(ctx, cc, frame)
		if err == nil {
			if keep {
				c.pool.Put(base, cc, c.maxIdle(), c.idleFor())
			} else {
				cc.NC.Close()
			}
			return a, nil
		}
		cc.NC.Close()
		if ctx.Err() != nil {
			return Answer{}, ctx.Err()
		}
		if reused && !sent && replay && attempt == 0 {
			continue // the master closed it just before the call
		}
		return Answer{}, fmt.Errorf("framed connection to %s: %w", base, err)
	}
}

// call writes frame and reads its answer. sent is false when the
// connection failed before any byte of an answer came.
func call(ctx context.Context, cc *connpool.Conn, frame []byte) (a Answer, keep, sent bool, err error) {
	stop := context.AfterFunc(ctx, func() { cc.NC.Close() })
	defer func() {
		if !stop() {
			keep = false // the context ended: the connection is closed
		}
	}()
	if _, err := cc.NC.Write(frame); err != nil {
		return a, false, false, err
	}
	var pre [4]byte
	if _, err := io.ReadFull(cc.BR, pre[:1]); err != nil {
		return a, false, false, err
	}
	if _, err := io.ReadFull(cc.BR, pre[1:]); err != nil {
		return a, false, true, err
	}
	n, err := Length(pre, MaxAnswer)
	if err != nil {
		return a, false, true, err
	}
	b := make([]byte, 0, min(n, 64<<10))
	if b, err = readN(cc.BR, b, n); err != nil {
		return a, false, true, err
	}
	if a, err = ParseAnswer(b); err != nil {
		return a, false, true, err
	}
	return a, !headerHas(a.Header, "Connection", "close"), true, nil
}

// readN appends n bytes from r to b, growing b as they come rather than
// by n at once (a length is only a claim until its bytes arrive).
func readN(r io.Reader, b []byte, n int) ([]byte, error) {
	for len(b) < n {
		if len(b) == cap(b) {
			nb := make([]byte, len(b), len(b)+min(n-len(b), max(cap(b), 4<<10)))
			copy(nb, b)
			b = nb
		}
		k, err := r.Read(b[len(b):min(cap(b), n)])
		b = b[:len(b)+k]
		if err != nil && len(b) < n {
			if err == io.EOF {
				err = io.ErrUnexpectedEOF
			}
			return b, err
		}
	}
	return b, nil
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

func (c *Client) idleFor() time.Duration {
	if c.IdleFor > 0 {
		return c.IdleFor
	}
	return DefaultIdleFor
}

// get takes an idle connection to base that is still open, or upgrades a
// new one.
func (c *Client) get(ctx context.Context, base string) (*connpool.Conn, bool, error) {
	if cc := c.pool.Get(base, c.idleFor()); cc != nil {
		return cc, true, nil
	}
	cc, err := c.upgrade(ctx, base)
	return cc, false, err
}

func (c *Client) maxIdle() int {
	if c.MaxIdle > 0 {
		return c.MaxIdle
	}
	return DefaultMaxIdle
}

func (c *Client) setOff(base string, d time.Duration) {
	c.mu.Lock()
	if c.off == nil {
		c.off = map[string]time.Time{}
	}
	c.off[base] = time.Now().Add(d)
	c.mu.Unlock()
}

// upgrade opens a framed connection to base: it dials as the transport
// does (its dialer and TLS settings), asks GET Path with Upgrade, and
// reads the 101.
func (c *Client) upgrade(ctx context.Context, base string) (*connpool.Conn, error) {
	tr := c.Transport
	if tr == nil {
		tr = http.DefaultTransport.(*http.Transport)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+Path, nil)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrNotUsed, err)
	}
	if tr.Proxy != nil {
		if pu, err := tr.Proxy(req); err != nil || pu != nil {
			c.setOff(base, time.Hour) // a proxy's rule does not change
			return nil, fmt.Errorf("%w: calls to %s go through a proxy", ErrNotUsed, base)
		}
	}
	u := req.URL
	if u.Scheme != "http" && u.Scheme != "https" {
		return nil, fmt.Errorf("%w: scheme %q", ErrNotUsed, u.Scheme)
	}
	nc, err := connpool.Dial(ctx, tr, u, upgradeTimeout)
	if err != nil {
		return nil, c.notSent(ctx, err)
	}
	ok := false
	defer func() {
		if !ok {
			nc.Close()
		}
	}()
	stop := context.AfterFunc(ctx, func() { nc.Close() })
	defer stop()
	nc.SetDeadline(time.Now().Add(upgradeTimeout))
	for k, vs := range c.Header {
		req.Header[k] = vs
	}
	req.Header.Set("Connection", "Upgrade")
	req.Header.Set("Upgrade", Protocol)
	if err := req.Write(nc); err != nil {
		return nil, c.notSent(ctx, err)
	}
	br := bufio.NewReaderSize(nc, 16<<10)
	resp, err := http.ReadResponse(br, req)
	if err != nil {
		return nil, c.notSent(ctx, err)
	}
	if resp.StatusCode != http.StatusSwitchingProtocols || !headerHas(resp.Header, "Upgrade", Protocol) {
		// An older master (404), a standby (503), a proxy that does not
		// pass upgrades: plain HTTP for a while; the plain call finds out
		// the rest.
		resp.Body.Close()
		retry := c.Retry
		if retry <= 0 {
			retry = DefaultRetry
		}
		if resp.StatusCode == http.StatusServiceUnavailable {
			retry = min(retry, DefaultRetryStandby)
		}
		c.setOff(base, retry)
		return nil, fmt.Errorf("%w: %s answered the upgrade %s", ErrNotUsed, base, resp.Status)
	}
	if !stop() {
		return nil, c.notSent(ctx, ctx.Err())
	}
	nc.SetDeadline(time.Time{})
	ok = true
	tag := strings.Join(resp.Header.Values(TakesHeader), ",")
	c.mu.Lock()
	if c.tags == nil {
		c.tags = map[string]string{}
	}
	c.tags[base] = tag
	c.mu.Unlock()
	return &connpool.Conn{NC: nc, BR: br, Tag: tag}, nil
}

// takes says whether tag (a TakesHeader's value) names family.
func takes(tag, family string) bool {
	return httpguts.HeaderValuesContainsToken([]string{tag}, family)
}

// notSent wraps an error of the dial or the upgrade (nothing of the call
// was sent); the context's error when it ended meanwhile.
func (c *Client) notSent(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		err = ctx.Err()
	}
	return fmt.Errorf("%w: %w", ErrNotSent, err)
}

// Close closes the idle connections; calls in flight close theirs when
// they end.
func (c *Client) Close() { c.pool.Close() }
