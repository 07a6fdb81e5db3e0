package server

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/gd2fs/gd2fs/internal/cold"
	"github.com/gd2fs/gd2fs/internal/crc32c"
	"github.com/gd2fs/gd2fs/internal/kvstore"
	"github.com/gd2fs/gd2fs/internal/store"
	"github.com/gd2fs/gd2fs/internal/testutil"
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
		done <- s.write(wire.ChunkRef{ID: 42, Forward: []string{hole.Addr().String()}}, 0, data, crc32c.Checksum(data), 0)
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

// TestCloseDoesNotWaitForHeartbeat: Close ends the heartbeat loop at once,
// however long the interval and whatever the context given to Run (issue
// 21, bug 2: it waited for the next tick, about 1 s per server in every
// test that starts a cluster).
func TestCloseDoesNotWaitForHeartbeat(t *testing.T) {
	// A master address nothing listens on: the heartbeat fails at once
	// and the loop then waits for its next tick, an hour away.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	master := "http://" + l.Addr().String()
	l.Close()
	s, err := New(Config{Listen: "127.0.0.1:0", Master: master, Heartbeat: time.Hour, Store: store.Config{MemBytes: 1 << 20}})
	if err != nil {
		t.Fatal(err)
	}
	ran := make(chan error, 1)
	go func() { ran <- s.Run(context.Background()) }()
	closed := make(chan error, 1)
	go func() { closed <- s.Close() }()
	select {
	case err := <-closed:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(20 * time.Second): // a failure detector, not synchronisation
		t.Fatal("Close waited for the heartbeat loop's next tick")
	}
	if err := <-ran; err != nil {
		t.Fatal(err)
	}
}

// TestNewClosesKVOnBadCold: a bad S3 configuration fails New without
// leaving the KV store it had opened (its segment files) behind.
func TestNewClosesKVOnBadCold(t *testing.T) {
	kvDir := filepath.Join(t.TempDir(), "kv")
	kcfg := kvstore.Config{Dir: kvDir, DiskBytes: 16 << 20}
	kv, err := kvstore.Open(kcfg) // a segment on disk, which Open keeps open
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Put([]byte("k"), []byte("v"), false); err != nil {
		t.Fatal(err)
	}
	if err := kv.Close(); err != nil {
		t.Fatal(err)
	}
	_, err = New(Config{Listen: "127.0.0.1:0", Store: store.Config{MemBytes: 1 << 20},
		KV:   kcfg,
		Cold: &cold.Config{Endpoint: "http://bad host:9"}})
	if err == nil {
		t.Fatal("New accepted an S3 endpoint with a space in its host")
	}
	if open := openFilesUnder(t, kvDir); len(open) > 0 {
		t.Fatalf("New failed but left the KV store's files open: %v", open)
	}
}

// openFilesUnder lists this process's open files under dir.
func openFilesUnder(t *testing.T, dir string) []string {
	t.Helper()
	fds, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	var open []string
	for _, fd := range fds {
		p, err := os.Readlink(filepath.Join("/proc/self/fd", fd.Name()))
		if err == nil && strings.HasPrefix(p, dir+"/") {
			open = append(open, p)
		}
	}
	return open
}

// TestMetricsCountPooledBuffers: the bytes the buffer pool keeps are a
// metric (they can reach about 3.2 GiB that no other figure counts).
func TestMetricsCountPooledBuffers(t *testing.T) {
	s, err := New(Config{Listen: "127.0.0.1:0", Store: store.Config{MemBytes: 1 << 20}})
	if err != nil {
		t.Fatal(err)
	}
	go s.Run(context.Background())
	defer s.Close()
	_, b, _ := testutil.Get(t, "http://"+s.Addr()+"/metrics")
	if !strings.Contains(b, "\ngd2fs_bufpool_held_bytes ") {
		t.Fatal("/metrics has no gd2fs_bufpool_held_bytes")
	}
}

// TestRunEndsWithTheServer: Run under a context that never ends
// (context.Background, as internal/cluster runs servers) leaves nothing
// behind once the server closes: its watcher of ctx waited for ever, one
// goroutine for each server a test process had started.
func TestRunEndsWithTheServer(t *testing.T) {
	// Counted, not looked for: a server an earlier test left running has
	// its own (no test here runs in parallel, so none starts meanwhile).
	runs := func() (int, string) {
		buf := make([]byte, 4<<20)
		dump := string(buf[:runtime.Stack(buf, true)])
		return strings.Count(dump, "server.(*Server).Run.func"), dump
	}
	before, _ := runs()
	s, err := New(Config{Listen: "127.0.0.1:0", Store: store.Config{MemBytes: 16 << 20}})
	if err != nil {
		t.Fatal(err)
	}
	ran := make(chan error, 1)
	go func() { ran <- s.Run(context.Background()) }()
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := <-ran; err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 30*time.Second, func() (bool, string) {
		if n, dump := runs(); n > before {
			return false, fmt.Sprintf("%d goroutines of Run, %d before the server started:\n%s", n, before, dump)
		}
		return true, ""
	})
}
