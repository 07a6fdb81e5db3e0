// Package tcp is the TCP transport of the data plane (docs/protocol.md),
// the client side: a pipelined connection that matches responses to
// requests by id and reads payloads straight into the caller's buffer, and a
// pool of such connections (several streams) per server. Clients (through
// client.NewTCPTransport, which puts the SDK's public Transport on it),
// servers (forwarding, repair copies) and the master use it.
package tcp

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gd2fs/gd2fs/errs"
	"github.com/gd2fs/gd2fs/internal/crc32c"
	"github.com/gd2fs/gd2fs/internal/wire"
)

// maxMsg bounds a response payload read without a caller buffer (errors, ids).
const maxMsg = 64 << 10

// Options configure connections.
type Options struct {
	Token       string        // cluster token sent in the handshake
	Name        string        // client name, for the server's logs
	Streams     int           // connections per server (default 4)
	DialTimeout time.Duration // default 5s
	LocalAddrs  []string      // local IPs to bind, one per NIC: streams spread over them (Pool.localFor)
	Limits      wire.Limits   // default wire.DefaultLimits()
	// TLS, when set, runs every connection over TLS with this client
	// configuration (ServerName defaults to the host of the address).
	TLS *tls.Config
}

func (o *Options) fill() {
	if o.Streams <= 0 {
		o.Streams = 4
	}
	if o.DialTimeout <= 0 {
		o.DialTimeout = 5 * time.Second
	}
	if o.Limits.MaxPayload == 0 {
		o.Limits = wire.DefaultLimits()
	}
}

// Request is one operation. Payload goes out gathered (writev); the response
// payload, when Dst is set, lands in Dst.
type Request struct {
	Op      wire.Op
	Flags   uint16
	Key     []byte
	Offset  uint64
	Count   uint64
	Payload [][]byte
	Dst     []byte
	// PayloadCRC is used as the payload's CRC32C when HaveCRC is set
	// (forwarding bytes already verified), instead of computing it again.
	PayloadCRC uint32
	HaveCRC    bool
	// Alloc: without Dst, take a success payload of any size (within the
	// frame limit) into a new slice, for values whose size is not known.
	Alloc bool
}

// Response is a completed request's header and, without Dst, its small payload.
type Response struct {
	Header wire.Header
	N      int    // payload bytes placed in Dst
	Body   []byte // payload when the request had no Dst
}

type call struct {
	dst   []byte
	alloc bool
	done  chan struct{}
	resp  Response
	err   error
}

// Conn is a pipelined connection to one server.
type Conn struct {
	nc   net.Conn
	addr string

	wmu sync.Mutex // serialises frame writes

	mu      sync.Mutex
	pending map[uint64]*call
	err     error // set once the connection is broken
	nextID  atomic.Uint64
}

// Dial connects to addr and performs the handshake.
func Dial(ctx context.Context, addr string, o Options, local string) (*Conn, error) {
	o.fill()
	d := net.Dialer{Timeout: o.DialTimeout}
	if local != "" {
		d.LocalAddr = &net.TCPAddr{IP: net.ParseIP(local)}
	}
	nc, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, errs.New(errs.ErrUnavailable, "connect to server %s: %w", addr, err)
	}
	if o.TLS != nil {
		if nc, err = clientTLS(ctx, nc, addr, o); err != nil {
			return nil, err
		}
	}
	return NewConn(ctx, nc, addr, o)
}

// NewConn runs the protocol on nc, a connection already made to the server
// at addr (named in errors): it sends the hello and waits for the answer
// within o.DialTimeout. On failure nc is closed.
func NewConn(ctx context.Context, nc net.Conn, addr string, o Options) (*Conn, error) {
	o.fill()
	c := &Conn{nc: nc, addr: addr, pending: make(map[uint64]*call)}
	go c.readLoop(wire.NewReader(nc, o.Limits))
	// The kernel accepts connections for a stopped process (SIGSTOP): only
	// the hello shows whether the server answers, so it shares the dial's
	// bound.
	hctx, cancel := context.WithTimeout(ctx, o.DialTimeout)
	defer cancel()
	if _, err := c.Do(hctx, &Request{Op: wire.OpHello, Key: []byte(o.Name), Payload: [][]byte{[]byte(o.Token)}}); err != nil {
		if ctx.Err() == nil && hctx.Err() != nil {
			err = errs.New(errs.ErrUnavailable, "server %s accepted the connection but did not answer the hello within %s (stopped or overloaded): %w", addr, o.DialTimeout, err)
		}
		c.Close()
		return nil, fmt.Errorf("handshake with %s: %w", addr, err)
	}
	return c, nil
}

// Close breaks the connection; pending requests fail.
func (c *Conn) Close() error {
	c.fail(errs.New(errs.ErrUnavailable, "connection to %s closed", c.addr))
	return nil
}

// Broken reports whether the connection can no longer be used.
func (c *Conn) Broken() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err != nil
}

func (c *Conn) fail(err error) {
	c.mu.Lock()
	if c.err != nil {
		c.mu.Unlock()
		return
	}
	c.err = err
	pending := c.pending
	c.pending = nil
	c.mu.Unlock()
	c.nc.Close()
	for _, cl := range pending {
		cl.err = err
		close(cl.done)
	}
}

// Do sends req and waits for its response. A non-OK status comes back as an
// error wrapping the matching errs sentinel.
func (c *Conn) Do(ctx context.Context, req *Request) (Response, error) {
	if err := ctx.Err(); err != nil {
		return Response{}, err // the caller gave up: send nothing
	}
	id := c.nextID.Add(1)
	cl := &call{dst: req.Dst, alloc: req.Alloc, done: make(chan struct{})}
	c.mu.Lock()
	if c.err != nil {
		err := c.err
		c.mu.Unlock()
		return Response{}, err
	}
	c.pending[id] = cl
	c.mu.Unlock()

	h := wire.Header{Op: req.Op, Flags: req.Flags, ReqID: id, Offset: req.Offset, Count: req.Count}
	var n int
	for _, p := range req.Payload {
		n += len(p)
	}
	h.PayloadLen = uint32(n)
	if req.HaveCRC {
		h.PayloadCRC = req.PayloadCRC
	} else {
		h.PayloadCRC = crc32c.Checksum(req.Payload...)
	}
	var hb [wire.HeaderSize]byte
	bufs := make(net.Buffers, 0, 2+len(req.Payload))
	bufs = append(bufs, wire.Encode(hb[:], &h, req.Key), req.Key)
	bufs = append(bufs, req.Payload...)

	c.wmu.Lock()
	if dl, ok := ctx.Deadline(); ok {
		c.nc.SetWriteDeadline(dl)
	} else {
		c.nc.SetWriteDeadline(time.Time{})
	}
	_, err := bufs.WriteTo(c.nc)
	c.wmu.Unlock()
	if err != nil {
		// A partial frame leaves the stream out of sync: the connection is done.
		c.fail(errs.New(errs.ErrUnavailable, "send to server %s: %w", c.addr, err))
	}

	select {
	case <-cl.done:
	case <-ctx.Done():
		c.mu.Lock()
		if _, waiting := c.pending[id]; waiting {
			delete(c.pending, id)
			c.mu.Unlock()
			return Response{}, ctx.Err()
		}
		c.mu.Unlock()
		if cl.dst == nil {
			// The reader has claimed the call but reads its reply into a
			// buffer of its own: nothing of the caller's is written after
			// we return, so the caller goes and the reader finishes the
			// reply; the other calls on the connection go on.
			return Response{}, ctx.Err()
		}
		// The reader has claimed the call and is reading its reply into Dst.
		// We must wait for it, so the caller's buffer is never written after
		// we return; but a server stopped mid-reply (SIGSTOP, a cut link
		// that sends no reset) would keep the reader in that read forever.
		// Closing the connection ends the read at once; the stream is
		// blocked behind this reply anyway, so the other calls on it fail
		// as unavailable and their callers go to another stream or replica.
		select {
		case <-cl.done:
		default:
			c.fail(errs.New(errs.ErrUnavailable, "server %s stopped in the middle of a reply: %w", c.addr, ctx.Err()))
			<-cl.done
		}
	}
	return cl.resp, cl.err
}

func (c *Conn) readLoop(r *wire.Reader) {
	for {
		h, _, err := r.Next()
		if err != nil {
			if errors.Is(err, io.EOF) || errors.Is(err, net.ErrClosed) {
				err = errs.New(errs.ErrUnavailable, "server %s closed the connection", c.addr)
			} else {
				err = errs.New(errs.ErrUnavailable, "connection to server %s: %w", c.addr, err)
			}
			c.fail(err)
			return
		}
		c.mu.Lock()
		cl := c.pending[h.ReqID]
		delete(c.pending, h.ReqID)
		c.mu.Unlock()
		if cl == nil { // abandoned by a cancelled caller
			if err := r.Discard(); err != nil {
				c.fail(err)
				return
			}
			continue
		}
		cl.resp.Header = h
		var perr error
		switch {
		case h.Status != wire.StatusOK && h.PayloadLen > maxMsg:
			perr = r.Discard()
			cl.err = errs.New(errs.ErrBadRequest, "server %s sent a %d-byte error message", c.addr, h.PayloadLen)
		case h.Status != wire.StatusOK || cl.dst == nil:
			if h.PayloadLen > maxMsg && !(cl.alloc && h.Status == wire.StatusOK) {
				perr = r.Discard()
				cl.err = errs.New(errs.ErrBadRequest, "server %s sent %d bytes where none were expected", c.addr, h.PayloadLen)
				break
			}
			body := make([]byte, h.PayloadLen)
			_, perr = r.ReadPayload(body, h.PayloadCRC)
			cl.resp.Body = body
			cl.err = wire.ErrorOf(h.Status, string(body))
		default:
			cl.resp.N, perr = r.ReadPayload(cl.dst, h.PayloadCRC)
		}
		// A CRC mismatch or an oversize payload fail this call only; the
		// stream is still in sync. Anything else broke the stream.
		if perr != nil && cl.err == nil {
			cl.err = perr
		}
		if perr != nil && perr != wire.ErrPayloadCRC && perr != wire.ErrShortPayload {
			cl.err = errs.New(errs.ErrUnavailable, "connection to server %s: %w", c.addr, perr)
			close(cl.done)
			c.fail(cl.err)
			return
		}
		close(cl.done)
	}
}

// clientTLS runs the TLS handshake on nc within the dial timeout.
func clientTLS(ctx context.Context, nc net.Conn, addr string, o Options) (net.Conn, error) {
	cfg := o.TLS
	if cfg.ServerName == "" {
		cfg = cfg.Clone()
		cfg.ServerName, _, _ = net.SplitHostPort(addr)
	}
	tc := tls.Client(nc, cfg)
	hctx, cancel := context.WithTimeout(ctx, o.DialTimeout)
	defer cancel()
	if err := tc.HandshakeContext(hctx); err != nil {
		nc.Close()
		return nil, errs.New(errs.ErrUnavailable, "TLS handshake with server %s: %w (check --tls-ca, and --tls-cert/--tls-key where servers require client certificates)", addr, err)
	}
	return tc, nil
}
