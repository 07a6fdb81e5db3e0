package resp

import (
	"context"
	"sync/atomic"
	"testing"
)

// slowPrefetch is a backend whose Prefetch runs until its context ends;
// nothing else of it is called.
type slowPrefetch struct {
	Backend
	started  chan struct{}
	returned atomic.Bool
}

func (b *slowPrefetch) Prefetch(ctx context.Context, key []byte) error {
	close(b.started)
	<-ctx.Done()
	b.returned.Store(true)
	return ctx.Err()
}

// TestCloseWaitsForPrefetch: Close returns only once a prefetch in flight
// has returned (it then releases the backend's client, which the prefetch
// uses), and no prefetch starts after Close.
func TestCloseWaitsForPrefetch(t *testing.T) {
	b := &slowPrefetch{started: make(chan struct{})}
	s, err := New(Config{Listen: "127.0.0.1:0", Backend: b})
	if err != nil {
		t.Fatal(err)
	}
	s.startPrefetch([]byte("k"))
	<-b.started
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if !b.returned.Load() {
		t.Fatal("Close returned while a prefetch was still using the backend")
	}
	s.startPrefetch([]byte("k2")) // would close b.started again: a panic
	if n := len(s.prefetching); n != 0 {
		t.Fatalf("%d prefetch slots held after Close", n)
	}
}
