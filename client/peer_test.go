package client_test

import (
	"bytes"
	"context"
	"sync/atomic"
	"testing"

	"github.com/gd2fs/gd2fs/client"
	"github.com/gd2fs/gd2fs/client/transporttest"
	"github.com/gd2fs/gd2fs/internal/kvstore"
	"github.com/gd2fs/gd2fs/internal/server"
	"github.com/gd2fs/gd2fs/internal/store"
)

// startPeers starts n standalone data servers (each owning every KV key)
// whose hops to each other go through the transport peers returns for
// each, or TCP when peers is nil.
func startPeers(t *testing.T, n int, peers func() client.PeerTransport) []string {
	var addrs []string
	for range n {
		cfg := server.Config{Listen: "127.0.0.1:0", Token: "tok", Store: store.Config{MemBytes: 16 << 20, Dir: t.TempDir(), DiskBytes: 64 << 20},
			KV: kvstore.Config{MemBytes: 8 << 20}}
		if peers != nil {
			cfg.Peers = peers()
		}
		s, err := server.New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		go s.Run(context.Background())
		t.Cleanup(func() { s.Close() })
		addrs = append(addrs, s.Addr())
	}
	return addrs
}

// TestTCPPeerTransportConforms runs the PeerTransport conformance suite
// against the TCP transport and real data servers on loopback.
func TestTCPPeerTransportConforms(t *testing.T) {
	transporttest.RunPeer(t, func(t *testing.T) transporttest.PeerEnv {
		return transporttest.PeerEnv{
			Transport: client.NewTCPPeerTransport(client.TCPOptions{Token: "tok", Name: "peer-conformance", Streams: 2}),
			Addrs:     startPeers(t, 2, nil), Pool: "perf",
		}
	})
}

// countingPeer counts the hops a server makes through its PeerTransport.
type countingPeer struct {
	client.PeerTransport
	forwards, stats, kvPuts atomic.Int64
}

func (c *countingPeer) ForwardChunk(ctx context.Context, addr string, id uint64, off int64, data [][]byte, crc uint32, sync bool) error {
	c.forwards.Add(1)
	return c.PeerTransport.ForwardChunk(ctx, addr, id, off, data, crc, sync)
}

func (c *countingPeer) StatChunk(ctx context.Context, addr string, id uint64) (int64, bool, error) {
	c.stats.Add(1)
	return c.PeerTransport.StatChunk(ctx, addr, id)
}

func (c *countingPeer) KVPutChecked(ctx context.Context, addr string, ref client.KVRef, epoch int64, v []byte, ow bool, crc uint32) (bool, error) {
	c.kvPuts.Add(1)
	return c.PeerTransport.KVPutChecked(ctx, addr, ref, epoch, v, ow, crc)
}

// TestServerPeersTransport: a server given a PeerTransport (server.Config.
// Peers, node.Server.Transport) sends its forwards of chunk writes (from a
// buffer and from DRAM pages), its repair copies and its KV forwards
// through it, not over a TCP pool of its own.
func TestServerPeersTransport(t *testing.T) {
	var made []*countingPeer
	addrs := startPeers(t, 2, func() client.PeerTransport {
		p := &countingPeer{PeerTransport: client.NewTCPPeerTransport(client.TCPOptions{Token: "tok", Name: "counted"})}
		made = append(made, p)
		return p
	})
	tr := client.NewTCPPeerTransport(client.TCPOptions{Token: "tok", Name: "test"})
	defer tr.Close()
	ctx := context.Background()
	data := rnd(1<<20+5, 9)
	// At the chunk's end (received into DRAM pages) and over it (through
	// a buffer): both forwards.
	for _, off := range []int64{0, 0} {
		if err := tr.WriteChunk(ctx, addrs[0], 77, off, data, addrs[1:]); err != nil {
			t.Fatal(err)
		}
	}
	got := make([]byte, len(data))
	if err := tr.ReadChunk(ctx, addrs[1], 77, 0, got); err != nil || !bytes.Equal(got, data) {
		t.Fatalf("replica after forwarded writes: %v", err)
	}
	if err := tr.CopyChunk(ctx, addrs[1], 78, addrs[0]); err == nil {
		t.Fatal("a copy of a chunk the source lacks succeeded")
	}
	if _, err := tr.KVPut(ctx, addrs[0], client.KVRef{Pool: "perf", Key: []byte("k"), Forward: addrs[1:]}, 0, []byte("v"), false); err != nil {
		t.Fatal(err)
	}
	if f, s, k := made[0].forwards.Load(), made[1].stats.Load(), made[0].kvPuts.Load(); f != 2 || s != 1 || k != 1 {
		t.Fatalf("the servers' transports carried %d forwards (want 2), %d copy stats (want 1), %d KV forwards (want 1)", f, s, k)
	}
}
