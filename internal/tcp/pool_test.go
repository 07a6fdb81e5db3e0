package tcp_test

import (
	"bytes"
	"context"
	"errors"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/gd2fs/gd2fs/errs"
	"github.com/gd2fs/gd2fs/internal/crc32c"
	"github.com/gd2fs/gd2fs/internal/server"
	"github.com/gd2fs/gd2fs/internal/store"
	"github.com/gd2fs/gd2fs/internal/tcp"
)

func startServer(t *testing.T, listen string) *server.Server {
	t.Helper()
	s, err := server.New(server.Config{Listen: listen, Token: "tok", Store: store.Config{MemBytes: 8 << 20}})
	if err != nil {
		t.Fatal(err)
	}
	go s.Run(context.Background())
	t.Cleanup(func() { s.Close() })
	return s
}

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return c
}

// TestPoolRealServer: a pool against a real data server on loopback: bytes
// round-trip, a wrong token is refused, a wrong CRC is a checksum error.
func TestPoolRealServer(t *testing.T) {
	s := startServer(t, "127.0.0.1:0")
	p := tcp.NewPool(tcp.Options{Token: "tok", Name: "test", Streams: 3})
	defer p.Close()
	data := bytes.Repeat([]byte("gd2fs"), 50000)
	if err := p.WriteChunk(ctx(t), s.Addr(), 7, 0, data, nil); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 6; i++ { // over every stream
		dst := make([]byte, 1000)
		if err := p.ReadChunk(ctx(t), s.Addr(), 7, int64(i*1000), dst); err != nil || !bytes.Equal(dst, data[i*1000:(i+1)*1000]) {
			t.Fatalf("read %d: %v", i, err)
		}
	}
	if n, sealed, err := p.StatChunk(ctx(t), s.Addr(), 7); err != nil || n != int64(len(data)) || sealed {
		t.Fatalf("stat: %d %v %v", n, sealed, err)
	}
	// The CRC the frame carries is checked: bytes that do not match it are
	// refused, and nothing is stored.
	bad := crc32c.Checksum([]byte("other"))
	if err := p.ForwardChunk(ctx(t), s.Addr(), 8, 0, []byte("hello"), nil, bad, 0); !errors.Is(err, errs.ErrChecksum) {
		t.Fatalf("a write whose CRC does not match: %v", err)
	}
	if err := p.ReadChunk(ctx(t), s.Addr(), 8, 0, make([]byte, 5)); !errors.Is(err, errs.ErrNotFound) {
		t.Fatalf("the refused write left a chunk: %v", err)
	}
	wrong := tcp.NewPool(tcp.Options{Token: "nope", Name: "test"})
	defer wrong.Close()
	if err := wrong.ReadChunk(ctx(t), s.Addr(), 7, 0, make([]byte, 1)); !errors.Is(err, errs.ErrUnauthorized) {
		t.Fatalf("wrong token: %v", err)
	}
}

// TestPoolServerRestart: a server that goes away fails calls as
// unavailable; once it is back on its address the pool dials it again.
func TestPoolServerRestart(t *testing.T) {
	s := startServer(t, "127.0.0.1:0")
	addr := s.Addr()
	p := tcp.NewPool(tcp.Options{Token: "tok", Streams: 2})
	defer p.Close()
	if err := p.WriteChunk(ctx(t), addr, 1, 0, []byte("before"), nil); err != nil {
		t.Fatal(err)
	}
	s.Close()
	if err := p.ReadChunk(ctx(t), addr, 1, 0, make([]byte, 6)); !errors.Is(err, errs.ErrUnavailable) {
		t.Fatalf("read from a closed server: %v", err)
	}
	startServer(t, addr) // DRAM only: the chunk is gone, the address is back
	if err := p.WriteChunk(ctx(t), addr, 2, 0, []byte("after"), nil); err != nil {
		t.Fatalf("write after the server came back: %v", err)
	}
}

// TestPoolStoppedServer: a server whose kernel accepts connections but that
// never answers (SIGSTOP) fails the dial within DialTimeout.
func TestPoolStoppedServer(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			defer c.Close()
		}
	}()
	p := tcp.NewPool(tcp.Options{DialTimeout: 200 * time.Millisecond})
	defer p.Close()
	err = p.ReadChunk(ctx(t), l.Addr().String(), 1, 0, make([]byte, 1))
	if !errors.Is(err, errs.ErrUnavailable) {
		t.Fatalf("a server that never answers the hello: %v", err)
	}
}

// TestPoolDialsWhileForgotten: many callers on the streams of a server that
// goes away and comes back; a refused dial forgets the server's streams
// while other callers are between their checks (this panicked once: a
// forgotten server's streams were indexed).
func TestPoolDialsWhileForgotten(t *testing.T) {
	s := startServer(t, "127.0.0.1:0")
	addr := s.Addr()
	p := tcp.NewPool(tcp.Options{Token: "tok", Streams: 4})
	defer p.Close()
	if err := p.WriteChunk(ctx(t), addr, 1, 0, []byte("x"), nil); err != nil {
		t.Fatal(err)
	}
	for round := 0; round < 3; round++ {
		s.Close()
		var wg sync.WaitGroup
		for g := 0; g < 8; g++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := 0; i < 20; i++ {
					p.ReadChunk(ctx(t), addr, 1, 0, make([]byte, 1)) // fails: nothing listens
				}
			}()
		}
		wg.Wait()
		s = startServer(t, addr)
		if err := p.WriteChunk(ctx(t), addr, 2, 0, []byte("after"), nil); err != nil {
			t.Fatalf("round %d: write after the server came back: %v", round, err)
		}
	}
}
