package router

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptrace"
	"net/textproto"
	"sync"
	"time"

	"github.com/gd2fs/gd2fs/internal/connpool"
)

// upstream is the router's HTTP/1.1 client of the engine, an
// http.RoundTripper: a request is written and its answer read by the
// calling goroutine, on a connection kept in a pool (internal/connpool).
// net/http's Transport passes each request to a connection's writer
// goroutine and its answer back from a reader goroutine; at a chat's pace
// (each request alone on an idle machine) those wake-ups were a tenth of
// the router's added latency (docs/benchmarks.md, "Nineteenth session").
//
// What it sends is what the Transport sends (Request.Write writes the
// request; http.ReadResponse reads the answer, chunked or not, trailers
// included), less the Transport's own additions: it asks for no gzip (the
// engine's answer passes as it comes) and never waits for a 100 Continue
// (it writes the whole body at once). Informational answers (1xx, at most
// max1xx) go to the request's trace, as the Transport's do, and the final
// answer is returned. Unlike the Transport it does not read while it
// writes: an engine that answers before it has read the whole request and
// closes the connection gets the write's error, not its answer (engines
// read whole bodies).
//
// A request the Transport would treat otherwise goes to it: an upgrade
// (a WebSocket: the answer's body must be writable), a URL that is not
// http://, or one the Transport's proxy rule sends through a proxy.
type upstream struct {
	tr   *http.Transport // the fallback; its dialer and proxy rule
	pool connpool.Pool
	// maxIdle and idleFor bound the pool as the Transport's idle
	// connections were bounded (engineIdleConns, IdleConnTimeout).
	maxIdle int
	idleFor time.Duration

	mu      sync.Mutex
	proxied map[string]bool // by scheme://host: the proxy rule's answer
}

// dialTimeout bounds a connection's dial, as net/http's default dialer's.
const dialTimeout = 30 * time.Second

// RoundTrip sends req and returns its answer; the answer's body is the
// caller's to read to its end (the connection then goes back to the pool)
// or close (the connection is closed). It is safe for concurrent use.
func (u *upstream) RoundTrip(req *http.Request) (*http.Response, error) {
	if !connpool.Peeks || req.URL.Scheme != "http" || req.Header.Get("Upgrade") != "" || u.viaProxy(req) {
		// Without the peek (off Linux) a connection the engine closed
		// while idle would be written to, and a POST on it not retried.
		return u.tr.RoundTrip(req)
	}
	resp, err := u.send(req)
	if err != nil && req.Body != nil {
		req.Body.Close() // a RoundTripper closes the body, whatever happened
	}
	return resp, err
}

// send writes req on a kept connection (or a new one) and reads its
// answer. A kept connection the engine closes just as it is taken (after
// the peek) fails the call: the request is sent once more, on another
// connection, when its body can be had again and either its write failed
// (the engine cannot have read it whole) or no byte of an answer came and
// it may be sent twice (GET, HEAD, OPTIONS, TRACE: the Transport's rule).
// A POST that was written is not sent again: the engine may have run it.
func (u *upstream) send(req *http.Request) (*http.Response, error) {
	ctx := req.Context()
	key := req.URL.Scheme + "://" + req.URL.Host
	// A body that streams (a pass-through request's) can be written once.
	again := req.Body == nil || req.Body == http.NoBody || req.GetBody != nil
	for attempt := 0; ; attempt++ {
		c := u.pool.Get(key, u.idleFor)
		reused := c != nil
		if c == nil {
			nc, err := connpool.Dial(ctx, u.tr, req.URL, dialTimeout)
			if err != nil {
				return nil, err
			}
			c = &connpool.Conn{NC: nc, BR: bufio.NewReaderSize(nc, 16<<10)}
		}
		// Cutting the connection is how a cancelled request ends: the
		// read or write in progress fails, and the connection is not kept.
		stop := context.AfterFunc(ctx, func() { c.NC.Close() })
		resp, sent, err := roundTrip(c, req)
		if err == nil {
			b := &upstreamBody{u: u, ctx: ctx, key: key, c: c, body: resp.Body, stop: stop,
				keep: !resp.Close && !req.Close && resp.StatusCode != http.StatusSwitchingProtocols}
			resp.Body = b
			if resp.ContentLength == 0 || req.Method == http.MethodHead || resp.StatusCode == http.StatusNoContent || resp.StatusCode == http.StatusNotModified {
				// No body: the connection is free now, whether or not
				// the caller reads the (empty) body.
				b.mu.Lock()
				b.finish(io.EOF)
				b.mu.Unlock()
			}
			return resp, nil
		}
		stop()
		c.NC.Close()
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		if reused && again && attempt == 0 && (sent == nothing || sent == request && replayable(req.Method)) {
			if req.GetBody != nil {
				b, gerr := req.GetBody()
				if gerr != nil {
					return nil, err
				}
				r2 := *req
				r2.Body = b
				req = &r2
			}
			continue
		}
		return nil, fmt.Errorf("engine %s: %w", key, err)
	}
}

// replayable methods may be sent twice (RFC 9110's idempotent ones that
// net/http's Transport replays).
func replayable(method string) bool {
	return method == http.MethodGet || method == http.MethodHead || method == http.MethodOptions || method == http.MethodTrace
}

// How far a call on a connection got before it failed.
const (
	nothing = iota // the request was not written whole
	request        // the request was written, no byte of an answer came
	answer         // some of an answer came
)

// max1xx bounds the informational answers (100 Continue, 103 Early
// Hints) read before a final one.
const max1xx = 8

// roundTrip writes req on c and reads the answer's head; sent says how
// far it got when it failed.
func roundTrip(c *connpool.Conn, req *http.Request) (resp *http.Response, sent int, err error) {
	bw := writers.Get().(*bufio.Writer)
	bw.Reset(c.NC)
	err = req.Write(bw)
	if err == nil {
		err = bw.Flush()
	}
	bw.Reset(nil)
	writers.Put(bw)
	if err != nil {
		return nil, nothing, err
	}
	if _, err := c.BR.Peek(1); err != nil {
		return nil, request, err
	}
	trace := httptrace.ContextClientTrace(req.Context())
	for n := 0; ; n++ {
		resp, err = http.ReadResponse(c.BR, req)
		if err != nil {
			return nil, answer, err
		}
		if resp.StatusCode >= 200 || resp.StatusCode == http.StatusSwitchingProtocols {
			return resp, answer, nil
		}
		// An informational answer, without a body: the answer is still
		// to come. Passed to the trace, as the Transport passes it (a
		// reverse proxy forwards 103 Early Hints so).
		if n == max1xx {
			return nil, answer, fmt.Errorf("more than %d informational answers", max1xx)
		}
		if trace != nil && trace.Got1xxResponse != nil {
			if err := trace.Got1xxResponse(resp.StatusCode, textproto.MIMEHeader(resp.Header)); err != nil {
				return nil, answer, err
			}
		}
	}
}

// writers buffer requests while they are written.
var writers = sync.Pool{New: func() any { return bufio.NewWriterSize(nil, 8<<10) }}

// viaProxy reports whether the Transport's proxy rule sends req through a
// proxy. The rule (the environment's, read once) is asked once a host.
func (u *upstream) viaProxy(req *http.Request) bool {
	if u.tr.Proxy == nil {
		return false
	}
	key := req.URL.Scheme + "://" + req.URL.Host
	u.mu.Lock()
	p, ok := u.proxied[key]
	u.mu.Unlock()
	if ok {
		return p
	}
	pu, err := u.tr.Proxy(req)
	p = err != nil || pu != nil // an error: let the Transport report it
	u.mu.Lock()
	if u.proxied == nil {
		u.proxied = map[string]bool{}
	}
	u.proxied[key] = p
	u.mu.Unlock()
	return p
}

// upstreamBody is an answer's body: read to its end, its connection goes
// back to the pool (when the answer and the request let it be kept);
// closed before, or failed, the connection is closed. Close may come from
// another goroutine while a Read waits: closing the connection ends it.
type upstreamBody struct {
	u    *upstream
	ctx  context.Context
	key  string
	c    *connpool.Conn
	body io.Reader
	stop func() bool // ends the request's cancellation
	keep bool

	mu   sync.Mutex
	done error // what a Read returns once the body is done with
}

func (b *upstreamBody) Read(p []byte) (int, error) {
	b.mu.Lock()
	done := b.done
	b.mu.Unlock()
	if done != nil {
		return 0, done
	}
	n, err := b.body.Read(p)
	if err != nil {
		if err != io.EOF && b.ctx.Err() != nil {
			// The request was cancelled (the client went away): its
			// error, as the Transport's (a reverse proxy does not log
			// it), not the cut connection's.
			err = b.ctx.Err()
		}
		b.mu.Lock()
		if b.done == nil {
			b.finish(err)
		}
		b.mu.Unlock()
	}
	return n, err
}

func (b *upstreamBody) Close() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.done == nil {
		b.finish(errBodyClosed)
	}
	return nil
}

// finish gives the connection back (err is io.EOF: the answer was read
// whole) or closes it; b.mu is held.
func (b *upstreamBody) finish(err error) {
	b.done = err
	cancelled := !b.stop()
	if err == io.EOF && b.keep && !cancelled && b.c.BR.Buffered() == 0 {
		b.u.pool.Put(b.key, b.c, b.u.maxIdle, b.u.idleFor)
		return
	}
	b.c.NC.Close()
}

// errBodyClosed is a read of an engine answer's body after its Close.
var errBodyClosed = errors.New("router: read on a closed engine answer body")
