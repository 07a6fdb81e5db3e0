package tcp

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/gd2fs/gd2fs/errs"
	"github.com/gd2fs/gd2fs/internal/crc32c"
	"github.com/gd2fs/gd2fs/internal/wire"
)

// frame is one request as a peer received it.
type frame struct {
	h       wire.Header
	key     []byte
	payload []byte
}

// peer is the server side of a net.Pipe, speaking the real frame codec:
// it answers the hello, then hands each request to the test on reqs and
// writes what the test sends on replies.
type peer struct {
	nc   net.Conn
	reqs chan frame
}

func newPeer(t *testing.T) (*Conn, *peer) {
	t.Helper()
	cnc, snc := net.Pipe()
	p := &peer{nc: snc, reqs: make(chan frame, 64)}
	go func() {
		r := wire.NewReader(snc, wire.DefaultLimits())
		for {
			h, key, err := r.Next()
			if err != nil {
				close(p.reqs)
				return
			}
			body := make([]byte, h.PayloadLen)
			if _, err := r.ReadPayload(body, h.PayloadCRC); err != nil {
				close(p.reqs)
				return
			}
			if h.Op == wire.OpHello {
				p.reply(h, wire.StatusOK, []byte("peer"), 0)
				continue
			}
			p.reqs <- frame{h, append([]byte(nil), key...), body}
		}
	}()
	c, err := NewConn(context.Background(), cnc, "pipe", Options{Name: "test"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close(); snc.Close() })
	return c, p
}

// reply answers req with payload; crc 0 means compute it.
func (p *peer) reply(req wire.Header, st wire.Status, payload []byte, crc uint32) error {
	h := wire.Header{Op: req.Op, ReqID: req.ReqID, Status: st, Flags: wire.FlagResponse, Offset: req.Offset, Count: req.Count,
		PayloadLen: uint32(len(payload)), PayloadCRC: crc}
	if crc == 0 {
		h.PayloadCRC = crc32c.Checksum(payload)
	}
	var hb [wire.HeaderSize]byte
	_, err := (&net.Buffers{wire.Encode(hb[:], &h, nil), payload}).WriteTo(p.nc)
	return err
}

func content(off uint64, n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(off) + byte(i)*7
	}
	return b
}

func readReq(off uint64, dst []byte) *Request {
	return &Request{Op: wire.OpRead, Key: binary.LittleEndian.AppendUint64(nil, 1), Offset: off, Count: uint64(len(dst)), Dst: dst}
}

// TestPipelining: many requests in flight on one connection, answered in
// the reverse order, each land in their own caller's buffer.
func TestPipelining(t *testing.T) {
	c, p := newPeer(t)
	const n = 32
	var wg sync.WaitGroup
	errc := make(chan error, n)
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			dst := make([]byte, 1000+i)
			if _, err := c.Do(context.Background(), readReq(uint64(i), dst)); err != nil {
				errc <- err
				return
			}
			if !bytes.Equal(dst, content(uint64(i), len(dst))) {
				errc <- errors.New("a reply landed in another call's buffer")
			}
		}()
	}
	var got []frame
	for len(got) < n { // all of them in flight at once
		got = append(got, <-p.reqs)
	}
	for i := n - 1; i >= 0; i-- {
		f := got[i]
		if err := p.reply(f.h, wire.StatusOK, content(f.h.Offset, int(f.h.Count)), 0); err != nil {
			t.Fatal(err)
		}
	}
	wg.Wait()
	close(errc)
	for err := range errc {
		t.Error(err)
	}
}

// TestChecksumError: a reply whose payload fails its CRC fails that call
// with checksum; the stream stays in sync and the next call works.
func TestChecksumError(t *testing.T) {
	c, p := newPeer(t)
	done := make(chan error, 1)
	dst := make([]byte, 100)
	go func() { _, err := c.Do(context.Background(), readReq(0, dst)); done <- err }()
	f := <-p.reqs
	if err := p.reply(f.h, wire.StatusOK, content(0, 100), crc32c.Checksum(content(0, 100))^1); err != nil {
		t.Fatal(err)
	}
	if err := <-done; !errors.Is(err, errs.ErrChecksum) {
		t.Fatalf("a reply with a bad CRC: %v, want checksum", err)
	}
	if c.Broken() {
		t.Fatal("a CRC error broke the connection")
	}
	go func() { _, err := c.Do(context.Background(), readReq(5, dst)); done <- err }()
	f = <-p.reqs
	p.reply(f.h, wire.StatusOK, content(5, 100), 0)
	if err := <-done; err != nil || !bytes.Equal(dst, content(5, 100)) {
		t.Fatalf("the call after a CRC error: %v", err)
	}
}

// TestErrorStatus: a status other than OK is the error of its kind, with
// the server's message.
func TestErrorStatus(t *testing.T) {
	c, p := newPeer(t)
	done := make(chan error, 1)
	go func() { _, err := c.Do(context.Background(), readReq(0, make([]byte, 10))); done <- err }()
	f := <-p.reqs
	p.reply(f.h, wire.StatusOf(errs.ErrSealed), []byte("chunk 1 is sealed"), 0)
	err := <-done
	if !errors.Is(err, errs.ErrSealed) || !bytes.Contains([]byte(err.Error()), []byte("chunk 1 is sealed")) {
		t.Fatalf("error status: %v", err)
	}
}

// TestDeadline: a call whose context ends before the reply fails with the
// context's error, and the late reply never touches its buffer.
func TestDeadline(t *testing.T) {
	c, p := newPeer(t)
	dst := make([]byte, 100)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { _, err := c.Do(ctx, readReq(0, dst)); done <- err }()
	f := <-p.reqs // the request is in flight, unanswered
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("a call whose context ended: %v", err)
	}
	p.reply(f.h, wire.StatusOK, content(0, 100), 0) // the late reply
	other := make([]byte, 100)
	go func() { _, err := c.Do(context.Background(), readReq(9, other)); done <- err }()
	f = <-p.reqs
	p.reply(f.h, wire.StatusOK, content(9, 100), 0)
	if err := <-done; err != nil || !bytes.Equal(other, content(9, 100)) {
		t.Fatalf("the call after an abandoned one: %v", err)
	}
	if !bytes.Equal(dst, make([]byte, 100)) {
		t.Fatal("the late reply was written into the abandoned call's buffer")
	}
	// A context that ended before the call sends nothing.
	if _, err := c.Do(ctx, readReq(0, dst)); !errors.Is(err, context.Canceled) {
		t.Fatalf("a call under an ended context: %v", err)
	}
	select {
	case f := <-p.reqs:
		t.Fatalf("a call under an ended context was sent (%v)", f.h.Op)
	default:
	}
}

// TestCutConnection: a connection cut mid-reply fails every call in
// flight as unavailable, and later calls at once.
func TestCutConnection(t *testing.T) {
	c, p := newPeer(t)
	done := make(chan error, 2)
	for i := 0; i < 2; i++ {
		go func() { _, err := c.Do(context.Background(), readReq(uint64(i), make([]byte, 1000))); done <- err }()
	}
	f := <-p.reqs
	<-p.reqs
	// Half a reply: the header promises 1000 bytes, 10 come, then the cut.
	h := wire.Header{Op: f.h.Op, ReqID: f.h.ReqID, Flags: wire.FlagResponse, PayloadLen: 1000, PayloadCRC: 1}
	var hb [wire.HeaderSize]byte
	p.nc.Write(wire.Encode(hb[:], &h, nil))
	p.nc.Write(make([]byte, 10))
	p.nc.Close()
	for i := 0; i < 2; i++ {
		if err := <-done; !errors.Is(err, errs.ErrUnavailable) {
			t.Fatalf("a call in flight on a cut connection: %v, want unavailable", err)
		}
	}
	if !c.Broken() {
		t.Fatal("a cut connection is not Broken")
	}
	if _, err := c.Do(context.Background(), readReq(0, make([]byte, 10))); !errors.Is(err, errs.ErrUnavailable) {
		t.Fatalf("a call on a broken connection: %v", err)
	}
}

// TestSilentServerHello: a server that accepts and never answers the hello
// fails NewConn within the dial timeout, as unavailable.
func TestSilentServerHello(t *testing.T) {
	cnc, snc := net.Pipe()
	defer snc.Close()
	go func() { // read forever, answer nothing
		b := make([]byte, 4096)
		for {
			if _, err := snc.Read(b); err != nil {
				return
			}
		}
	}()
	start := time.Now()
	_, err := NewConn(context.Background(), cnc, "silent", Options{DialTimeout: 100 * time.Millisecond})
	if !errors.Is(err, errs.ErrUnavailable) {
		t.Fatalf("hello to a silent server: %v", err)
	}
	if el := time.Since(start); el > 20*time.Second {
		t.Fatalf("hello to a silent server took %s", el)
	}
}

// TestStalledReply: a server that stops in the middle of a reply (SIGSTOP:
// the socket stays open, nothing more comes) must not hold the caller past
// its context. The reader had claimed the call and was writing into its
// buffer, so the connection is closed to end that read.
func TestStalledReply(t *testing.T) {
	c, p := newPeer(t)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { _, err := c.Do(ctx, readReq(0, make([]byte, 1000))); done <- err }()
	f := <-p.reqs
	h := wire.Header{Op: f.h.Op, ReqID: f.h.ReqID, Flags: wire.FlagResponse, PayloadLen: 1000, PayloadCRC: 1}
	var hb [wire.HeaderSize]byte
	if _, err := p.nc.Write(wire.Encode(hb[:], &h, nil)); err != nil {
		t.Fatal(err)
	}
	// net.Pipe: this write returns once the reader took the bytes, inside
	// the reply's payload (the header was whole): the call is claimed.
	if _, err := p.nc.Write(make([]byte, 10)); err != nil {
		t.Fatal(err)
	}
	cancel() // the caller's deadline; the peer sends nothing more
	select {
	case err := <-done:
		if !errors.Is(err, errs.ErrUnavailable) {
			t.Fatalf("a call whose reply stalled: %v, want unavailable", err)
		}
	case <-time.After(time.Minute): // a hang, not a slow answer
		t.Fatal("a call whose reply stalled mid-payload did not return after its context ended")
	}
	if !c.Broken() {
		t.Fatal("the connection of a stalled reply is not Broken")
	}
}

// TestCancelledCallOwnBuffer: a call whose reply goes into the reader's own
// buffer (no Dst), cancelled once the reader has started on its reply,
// returns its context's error and leaves the connection up: the other call
// in flight on it gets its answer.
func TestCancelledCallOwnBuffer(t *testing.T) {
	c, p := newPeer(t)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		_, err := c.Do(ctx, &Request{Op: wire.OpRead, Key: binary.LittleEndian.AppendUint64(nil, 1), Count: 1000, Alloc: true})
		done <- err
	}()
	fa := <-p.reqs
	type result struct {
		resp Response
		err  error
	}
	other := make(chan result, 1)
	dst := make([]byte, 100)
	go func() { r, err := c.Do(context.Background(), readReq(0, dst)); other <- result{r, err} }()
	fb := <-p.reqs

	body := content(0, 1000)
	h := wire.Header{Op: fa.h.Op, ReqID: fa.h.ReqID, Flags: wire.FlagResponse, PayloadLen: uint32(len(body)), PayloadCRC: crc32c.Checksum(body)}
	var hb [wire.HeaderSize]byte
	if _, err := p.nc.Write(wire.Encode(hb[:], &h, nil)); err != nil {
		t.Fatal(err)
	}
	// net.Pipe: this write returns once the reader took the bytes, inside
	// the reply's payload: the call is claimed.
	if _, err := p.nc.Write(body[:10]); err != nil {
		t.Fatal(err)
	}
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("the cancelled call: %v, want context.Canceled", err)
	}
	if c.Broken() {
		t.Fatal("a cancelled call without a caller buffer broke the connection")
	}
	if _, err := p.nc.Write(body[10:]); err != nil {
		t.Fatal(err)
	}
	if err := p.reply(fb.h, wire.StatusOK, content(0, len(dst)), 0); err != nil {
		t.Fatal(err)
	}
	r := <-other
	if r.err != nil || r.resp.N != len(dst) || !bytes.Equal(dst, content(0, len(dst))) {
		t.Fatalf("the other call on the connection: n=%d %v", r.resp.N, r.err)
	}
}
