package cluster

import (
	"bytes"
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gd2fs/gd2fs/client"
	"github.com/gd2fs/gd2fs/internal/testutil"
)

// countedPeers counts the chunk hops the cluster's own processes make
// through their data plane.
type countedPeers struct {
	client.PeerTransport
	forwards, probes, copies *atomic.Int64
}

func (c countedPeers) ForwardChunk(ctx context.Context, addr string, id uint64, off int64, data [][]byte, crc uint32, sync bool) error {
	c.forwards.Add(1)
	return c.PeerTransport.ForwardChunk(ctx, addr, id, off, data, crc, sync)
}

func (c countedPeers) ChunkExtents(ctx context.Context, addr string, id uint64, off, n int64) ([]int64, int64, bool, error) {
	c.probes.Add(1)
	return c.PeerTransport.ChunkExtents(ctx, addr, id, off, n)
}

func (c countedPeers) StatChunk(ctx context.Context, addr string, id uint64) (int64, bool, error) {
	c.probes.Add(1)
	return c.PeerTransport.StatChunk(ctx, addr, id)
}

func (c countedPeers) CopyChunk(ctx context.Context, addr string, id uint64, src string) error {
	c.copies.Add(1)
	return c.PeerTransport.CopyChunk(ctx, addr, id, src)
}

// TestTransportCarriesEveryHop: with a data plane given in the composition
// (Config.Transport → node.Server.Transport, node.Master.Transport), the
// servers' forwards of an HA write, the master's probes of what servers
// hold and its repair copies after a server is lost all go through it, and
// the bytes come back whole.
func TestTransportCarriesEveryHop(t *testing.T) {
	var forwards, probes, copies atomic.Int64
	c, err := Start(context.Background(), Config{Dir: t.TempDir(), Servers: 4, MemBytes: 16 << 20, DiskBytes: 256 << 20,
		DownAfter: time.Second, RepairAfter: time.Second,
		Transport: func() client.PeerTransport {
			return countedPeers{client.NewTCPPeerTransport(client.TCPOptions{Name: "counted"}), &forwards, &probes, &copies}
		}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	cl := c.Client()
	defer cl.Close()
	ctx := context.Background()
	data := testutil.RandomBytes(3<<20, 5)
	f, err := cl.Create(ctx, "/ha/every-hop", client.CreateOptions{Pool: "ha"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.Write(data); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	if forwards.Load() == 0 {
		t.Fatal("no forward of the HA write went through the servers' data plane")
	}
	// Lose a server holding the file: the master repairs through its own.
	var victim int
	for victim = range c.Servers {
		if len(c.Servers[victim].Store().List()) > 0 {
			break
		}
	}
	c.Servers[victim].Close()
	testutil.Eventually(t, 30*time.Second, func() (bool, string) {
		return copies.Load() > 0, "no repair copy went through the master's data plane"
	})
	g, err := cl.Open(ctx, "/ha/every-hop")
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	got := make([]byte, len(data))
	if _, err := g.ReadAt(got, 0); err != nil || !bytes.Equal(got, data) {
		t.Fatalf("read after repair: %v (equal %v)", err, bytes.Equal(got, data))
	}
	if probes.Load() == 0 {
		t.Fatal("no probe of a server (stat, extents) went through the data plane")
	}
}
