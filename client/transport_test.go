package client_test

import (
	"bytes"
	"context"
	"fmt"
	"sync/atomic"
	"testing"

	"github.com/gd2fs/gd2fs/client"
	"github.com/gd2fs/gd2fs/client/transporttest"
	"github.com/gd2fs/gd2fs/internal/cold"
	"github.com/gd2fs/gd2fs/internal/kvstore"
	"github.com/gd2fs/gd2fs/internal/s3test"
	"github.com/gd2fs/gd2fs/internal/server"
	"github.com/gd2fs/gd2fs/internal/store"
)

var coldObjects atomic.Int64

// TestTCPTransportConforms runs the Transport conformance suite against the
// TCP transport and real data servers on loopback (standalone: each owns
// every KV key), filling linked chunks from an S3 server on loopback.
func TestTCPTransportConforms(t *testing.T) {
	s3 := s3test.Start("AKID", "secret")
	t.Cleanup(s3.Close)
	if err := s3.CreateBucket("cold"); err != nil {
		t.Fatal(err)
	}
	cc := &cold.Config{Endpoint: s3.URL, AccessKey: "AKID", SecretKey: "secret", Region: "us-east-1"}
	transporttest.Run(t, func(t *testing.T) transporttest.Env {
		var addrs []string
		for i := 0; i < 2; i++ {
			s, err := server.New(server.Config{Listen: "127.0.0.1:0", Token: "tok", Store: store.Config{MemBytes: 16 << 20},
				KV: kvstore.Config{MemBytes: 8 << 20}, Cold: cc})
			if err != nil {
				t.Fatal(err)
			}
			go s.Run(context.Background())
			t.Cleanup(func() { s.Close() })
			addrs = append(addrs, s.Addr())
		}
		return transporttest.Env{
			Transport: client.NewTCPTransport(client.TCPOptions{Token: "tok", Name: "conformance", Streams: 2}),
			Addrs:     addrs, Pool: "perf",
			Cold: func(t *testing.T, data []byte) client.ColdRef {
				n := coldObjects.Add(1)
				key := fmt.Sprintf("object-%d", n)
				if err := s3.Put("cold", key, data); err != nil {
					t.Fatal(err)
				}
				return client.ColdRef{ID: uint64(1<<50 + n), Length: int64(len(data)), URI: "s3://cold/" + key}
			},
		}
	})
}

// counting counts the calls the client makes through its Transport.
type counting struct {
	client.Transport
	chunk, kv atomic.Int64
}

func (c *counting) WriteChunk(ctx context.Context, addr string, id uint64, off int64, data []byte, fwd []string) error {
	c.chunk.Add(1)
	return c.Transport.WriteChunk(ctx, addr, id, off, data, fwd)
}

func (c *counting) ReadChunk(ctx context.Context, addr string, id uint64, off int64, dst []byte) error {
	c.chunk.Add(1)
	return c.Transport.ReadChunk(ctx, addr, id, off, dst)
}

func (c *counting) KVPut(ctx context.Context, addr string, ref client.KVRef, epoch int64, v []byte, ow bool) (bool, error) {
	c.kv.Add(1)
	return c.Transport.KVPut(ctx, addr, ref, epoch, v, ow)
}

func (c *counting) KVGet(ctx context.Context, addr string, ref client.KVRef, epoch int64, dst []byte) ([]byte, error) {
	c.kv.Add(1)
	return c.Transport.KVGet(ctx, addr, ref, epoch, dst)
}

// TestConfigTransport: a Transport set in Config carries the client's file
// and KV traffic, and the client closes it.
func TestConfigTransport(t *testing.T) {
	c := startKV(t, 2)
	tr := &counting{Transport: client.NewTCPTransport(client.TCPOptions{Name: "counted"})}
	cl, err := client.New(client.Config{Master: c.Master.URL(), Transport: tr})
	if err != nil {
		t.Fatal(err)
	}
	data := rnd(3<<20, 5)
	writeFile(t, cl, "/counted", "perf", data)
	if got, err := readFile(t, cl, "/counted"); err != nil || !bytes.Equal(got, data) {
		t.Fatalf("file through the configured transport: %v", err)
	}
	ctx := context.Background()
	if err := cl.KV("perf").Put(ctx, "k", []byte("v")); err != nil {
		t.Fatal(err)
	}
	if v, err := cl.KV("perf").Get(ctx, "k"); err != nil || string(v) != "v" {
		t.Fatalf("KV through the configured transport: %q %v", v, err)
	}
	if tr.chunk.Load() == 0 || tr.kv.Load() < 2 {
		t.Fatalf("the configured transport carried %d chunk and %d KV calls", tr.chunk.Load(), tr.kv.Load())
	}
	cl.Close()
	if err := tr.ReadChunk(ctx, c.Servers[0].Addr(), 1, 0, make([]byte, 1)); err == nil {
		t.Fatal("the client did not close its transport")
	}
}
