package client_test

import (
	"context"
	"io"
	"net"
	"strings"
	"sync"
	"testing"

	"github.com/gd2fs/gd2fs/client"
	"github.com/gd2fs/gd2fs/internal/cluster"
	"github.com/gd2fs/gd2fs/internal/testutil"
)

// TestMasterConnectionsReused: a client keeps its connections to the
// master for its next calls, with more calls in flight than net/http's
// default of two idle connections a host (each call beyond those dialed a
// new connection and closed it after: a router at 64 chats paid a TCP
// handshake on most plans). A forwarder in front of the real master counts
// the connections and holds each round's requests until all n have come,
// so n calls are in flight at once; over the rounds they reuse the same
// connections.
func TestMasterConnectionsReused(t *testing.T) {
	const n, rounds = 8, 6
	c := start(t, cluster.Config{})
	master := strings.TrimPrefix(c.Master.URL(), "http://")
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	var mu sync.Mutex
	accepted := 0
	// held.Arrive counts a request (one read: small requests on loopback
	// come whole) and waits until the round's n have come.
	held := testutil.NewRounds(n)
	var conns sync.WaitGroup
	defer conns.Wait()
	go func() {
		for {
			in, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			accepted++
			mu.Unlock()
			conns.Add(1)
			go func() {
				defer conns.Done()
				defer in.Close()
				out, err := net.Dial("tcp", master)
				if err != nil {
					t.Error(err)
					return
				}
				defer out.Close()
				go func() { io.Copy(in, out); in.Close() }()
				buf := make([]byte, 64<<10)
				for {
					k, err := in.Read(buf)
					if k > 0 {
						held.Arrive()
						if _, werr := out.Write(buf[:k]); werr != nil {
							return
						}
					}
					if err != nil {
						return
					}
				}
			}()
		}
	}()
	cl, err := client.New(client.Config{Master: "http://" + ln.Addr().String()})
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx := context.Background()
	for round := 0; round < rounds; round++ {
		var wg sync.WaitGroup
		errc := make(chan error, n)
		for i := 0; i < n; i++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if _, err := cl.Status(ctx); err != nil {
					errc <- err
				}
			}()
		}
		wg.Wait()
		close(errc)
		for err := range errc {
			t.Fatal(err)
		}
	}
	cl.Close() // its idle connections end, and with them the forwarder's
	ln.Close()
	mu.Lock()
	got := accepted
	mu.Unlock()
	// n in use at once, a few more dialed while another goes back to the
	// pool; without the pool, every round after the first dials n-2 anew.
	if got > 2*n {
		t.Fatalf("%d connections to the master for %d rounds of %d calls: the client does not keep its connections", got, rounds, n)
	}
}
