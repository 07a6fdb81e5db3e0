package server

import (
	"context"
	"net"
	"testing"
	"time"

	"github.com/gd2fs/gd2fs/internal/store"
	"github.com/gd2fs/gd2fs/internal/wire"
)

// TestCloseEndsForwards: a write forwarded to a replica that accepts the
// connection and never answers ends when the server closes, not when the
// forward's 60-second timeout runs out.
func TestCloseEndsForwards(t *testing.T) {
	s, err := New(Config{Listen: "127.0.0.1:0", Store: store.Config{MemBytes: 16 << 20}})
	if err != nil {
		t.Fatal(err)
	}
	go s.Run(context.Background())
	defer s.Close()

	// The silent replica: accepts, reads nothing, answers nothing.
	hole, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer hole.Close()
	accepted := make(chan net.Conn, 4)
	go func() {
		for {
			c, err := hole.Accept()
			if err != nil {
				return
			}
			accepted <- c
		}
	}()
	done := make(chan error, 1)
	// Counted like a connection's handler, so Close waits for it.
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		data := []byte("hello")
		done <- s.write(wire.ChunkRef{ID: 42, Forward: []string{hole.Addr().String()}}, 0, data, wire.Checksum(data), 0)
	}()
	select {
	case c := <-accepted:
		defer c.Close()
	case <-time.After(30 * time.Second):
		t.Fatal("the forward never connected")
	}
	closed := make(chan struct{})
	go func() { s.Close(); close(closed) }()
	select {
	case err := <-done:
		if err == nil {
			t.Fatal("a write whose forward never completed succeeded")
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the forward outlived Close")
	}
	<-closed
}
