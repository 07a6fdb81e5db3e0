package server

import (
	"context"
	"errors"
	"io"
	"net"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/gd2fs/gd2fs/internal/store"
	"github.com/gd2fs/gd2fs/internal/tcp"
	"github.com/gd2fs/gd2fs/internal/wire"
)

// startLimited runs a standalone DRAM server with cfg's limits.
func startLimited(t *testing.T, cfg Config) (*Server, chan error) {
	t.Helper()
	cfg.Listen = "127.0.0.1:0"
	cfg.Store = store.Config{MemBytes: 64 << 20}
	s, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- s.Run(context.Background()) }()
	t.Cleanup(func() { s.Close() })
	return s, done
}

// ping dials with a handshake and sends one ping, within 5 s.
func ping(addr string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := tcp.Dial(ctx, addr, tcp.Options{Name: "test"}, "")
	if err != nil {
		return err
	}
	defer c.Close()
	_, err = c.Do(ctx, &tcp.Request{Op: wire.OpPing})
	return err
}

// closedWithin reports whether the server closes c within d.
func closedWithin(c net.Conn, d time.Duration) bool {
	c.SetReadDeadline(time.Now().Add(d))
	_, err := io.Copy(io.Discard, c)
	return err == nil || !errors.Is(err, os.ErrDeadlineExceeded)
}

// TestAcceptSurvivesEMFILE: a flood of magic-only connections exhausts the
// process's file descriptors (the limit is lowered for the test instead of
// opening 20k sockets). The accept loop must keep running, report itself
// unhealthy meanwhile, and serve again once the flood is gone (issue 16.1).
func TestAcceptSurvivesEMFILE(t *testing.T) {
	s, done := startLimited(t, Config{HelloTimeout: 3 * time.Second})
	addr := s.Addr()
	if err := ping(addr); err != nil {
		t.Fatal(err)
	}
	var old syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &old); err != nil {
		t.Fatal(err)
	}
	fds, _ := os.ReadDir("/proc/self/fd")
	low := old
	low.Cur = uint64(len(fds) + 24)
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &low); err != nil {
		t.Skipf("cannot lower RLIMIT_NOFILE: %v", err)
	}
	restored := false
	restore := func() {
		if !restored {
			syscall.Setrlimit(syscall.RLIMIT_NOFILE, &old)
			restored = true
		}
	}
	defer restore()

	var flood []net.Conn
	deadline := time.Now().Add(10 * time.Second)
	for s.ln.Failures.Load() == 0 && time.Now().Before(deadline) {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err != nil {
			// Our side ran out first: free one descriptor so the next dial
			// takes it and the server's accept finds none.
			if len(flood) > 0 {
				flood[0].Close()
				flood = flood[1:]
			}
			time.Sleep(time.Millisecond)
			continue
		}
		c.Write([]byte("GD2F"))
		flood = append(flood, c)
	}
	if s.ln.Failures.Load() == 0 {
		t.Fatal("the flood did not exhaust the server's descriptors")
	}
	if s.unhealthy() == "" {
		t.Error("server does not report itself unhealthy while accept fails")
	}
	select {
	case err := <-done:
		t.Fatalf("accept loop ended during the flood: %v", err)
	default:
	}
	for _, c := range flood {
		c.Close()
	}
	restore()
	// The port serves again, and the server is healthy again.
	var err error
	for range 3 {
		if err = ping(addr); err == nil {
			break
		}
	}
	if err != nil {
		t.Fatalf("server does not serve after the flood: %v", err)
	}
	if u := s.unhealthy(); u != "" {
		t.Fatalf("still unhealthy after serving: %s", u)
	}
}

// TestDeadlines: every phase of a data connection has a deadline (16.1).
func TestDeadlines(t *testing.T) {
	s, _ := startLimited(t, Config{HelloTimeout: 200 * time.Millisecond, IdleTimeout: 300 * time.Millisecond, PayloadTimeout: 300 * time.Millisecond})
	dial := func() net.Conn {
		c, err := net.Dial("tcp", s.Addr())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	t.Run("hello", func(t *testing.T) {
		c := dial()
		c.Write([]byte("GD2F")) // the magic and nothing else
		if !closedWithin(c, 5*time.Second) {
			t.Fatal("a connection that sent only the magic is kept open")
		}
		if !closedWithin(dial(), 5*time.Second) { // and one that sent nothing
			t.Fatal("a silent connection is kept open")
		}
	})
	hello := func(c net.Conn) {
		var hb [wire.HeaderSize]byte
		h := wire.Header{Op: wire.OpHello, ReqID: 1}
		c.Write(wire.Encode(hb[:], &h, nil))
		var resp [wire.HeaderSize + 64]byte
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		if _, err := io.ReadAtLeast(c, resp[:], wire.HeaderSize); err != nil {
			t.Fatal(err)
		}
		c.SetReadDeadline(time.Time{})
	}
	t.Run("idle", func(t *testing.T) {
		c := dial()
		hello(c)
		if !closedWithin(c, 5*time.Second) {
			t.Fatal("an idle connection is kept open")
		}
	})
	t.Run("payload", func(t *testing.T) {
		c := dial()
		hello(c)
		var hb [wire.HeaderSize]byte
		key := wire.AppendChunkRef(nil, wire.ChunkRef{ID: 7})
		h := wire.Header{Op: wire.OpWrite, ReqID: 2, PayloadLen: 1 << 20}
		c.Write(wire.Encode(hb[:], &h, key))
		c.Write(key)
		c.Write(make([]byte, 1000)) // and never the rest
		if !closedWithin(c, 5*time.Second) {
			t.Fatal("a connection stalled mid-payload is kept open")
		}
	})
	t.Run("busy", func(t *testing.T) {
		// A connection that keeps working is not cut by the idle deadline.
		ctx := context.Background()
		c, err := tcp.Dial(ctx, s.Addr(), tcp.Options{Name: "test"}, "")
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		for range 8 {
			if _, err := c.Do(ctx, &tcp.Request{Op: wire.OpPing}); err != nil {
				t.Fatal(err)
			}
			time.Sleep(100 * time.Millisecond)
		}
	})
}

// TestConnLimit: past MaxConns a new connection is closed at once, and a
// slot frees when a connection ends.
func TestConnLimit(t *testing.T) {
	s, _ := startLimited(t, Config{MaxConns: 2})
	ctx := context.Background()
	a, err := tcp.Dial(ctx, s.Addr(), tcp.Options{Name: "a"}, "")
	if err != nil {
		t.Fatal(err)
	}
	b, err := tcp.Dial(ctx, s.Addr(), tcp.Options{Name: "b"}, "")
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	if err := ping(s.Addr()); err == nil {
		t.Fatal("a third connection was served past MaxConns=2")
	}
	a.Close()
	var perr error
	for range 50 { // the server sees a's close asynchronously
		if perr = ping(s.Addr()); perr == nil {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if perr != nil {
		t.Fatalf("no slot after a connection closed: %v", perr)
	}
}
