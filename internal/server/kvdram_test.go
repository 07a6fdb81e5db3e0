package server_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"testing"
	"time"

	"github.com/gd2fs/gd2fs/client"
	"github.com/gd2fs/gd2fs/errs"
	"github.com/gd2fs/gd2fs/internal/cluster"
	"github.com/gd2fs/gd2fs/internal/crc32c"
	"github.com/gd2fs/gd2fs/internal/tcp"
	"github.com/gd2fs/gd2fs/internal/testutil"
	"github.com/gd2fs/gd2fs/internal/wire"
)

// TestKVPutIntoDRAM: a binary-protocol put of a large value is received
// straight into DRAM pages its owner reserves, and reads back with the
// CRC checked; a write-once put of a key there keeps the old value; a
// payload whose CRC does not match, a put to a server that does not own
// the key, and a client gone in the middle of a payload store nothing
// and leave no DRAM held, and the connection of the first goes on.
func TestKVPutIntoDRAM(t *testing.T) {
	c, err := cluster.Start(context.Background(), cluster.Config{Dir: t.TempDir(), Servers: 2, MemBytes: 8 << 20, KVMemBytes: 32 << 20})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx := context.Background()
	kv := c.Client().KV("perf")
	owner := func(key string) (own, other int) {
		t.Helper()
		ids, err := kv.Owners(ctx, key)
		if err != nil || len(ids) != 1 {
			t.Fatalf("owners of %s: %v %v", key, ids, err)
		}
		if c.Servers[0].ID() == ids[0] {
			return 0, 1
		}
		return 1, 0
	}
	v1 := testutil.RandomBytes(1<<20+3, 1)
	v2 := testutil.RandomBytes(200<<10, 2)
	o, _ := owner("k")
	st := c.Servers[o].KV()

	if err := kv.Put(ctx, "k", v1); err != nil {
		t.Fatal(err)
	}
	if got := st.Stats().ReservedPuts; got != 1 {
		t.Fatalf("%d puts received into DRAM pages, want 1", got)
	}
	if got, err := kv.Get(ctx, "k"); err != nil || !bytes.Equal(got, v1) {
		t.Fatalf("get: %v", err)
	}
	if existed, err := kv.PutWith(ctx, "k", v2, client.PutOptions{}); err != nil || !existed {
		t.Fatalf("write-once put over a key: %v %v", existed, err)
	}
	if got, _ := kv.Get(ctx, "k"); !bytes.Equal(got, v1) {
		t.Fatal("a write-once put replaced the value")
	}

	used := func(i int) int64 { return c.Servers[i].KV().Stats().MemUsed }
	before := [2]int64{used(0), used(1)}
	p := tcp.NewPool(tcp.Options{Name: "test"})
	defer p.Close()
	ref := wire.KVRef{Pool: "perf", Key: []byte("bad")}
	bo, bn := owner("bad")
	if _, err := p.KVPut(ctx, c.Servers[bo].Addr(), ref, 0, v1, true, crc32c.Checksum(v1)+1); !errors.Is(err, errs.ErrChecksum) {
		t.Fatalf("a payload with a wrong CRC: %v", err)
	}
	if _, err := p.KVPut(ctx, c.Servers[bn].Addr(), ref, 0, v1, true, crc32c.Checksum(v1)); !errors.Is(err, errs.ErrMoved) {
		t.Fatalf("a put to the server that does not own the key: %v", err)
	}
	if _, err := p.KVPut(ctx, c.Servers[bo].Addr(), ref, 0, v2, true, crc32c.Checksum(v2)); err != nil {
		t.Fatalf("a put on the connection that sent a bad CRC: %v", err)
	}
	if got, err := kv.Get(ctx, "bad"); err != nil || !bytes.Equal(got, v2) {
		t.Fatalf("the put after the bad CRC: %v", err)
	}
	if err := kv.Delete(ctx, "bad"); err != nil {
		t.Fatal(err)
	}

	// Gone in the middle of a payload.
	nc, err := net.Dial("tcp", c.Servers[o].Addr())
	if err != nil {
		t.Fatal(err)
	}
	var hb [wire.HeaderSize]byte
	h := wire.Header{Op: wire.OpHello, ReqID: 1}
	nc.Write(wire.Encode(hb[:], &h, nil))
	var reply [wire.HeaderSize + 64]byte
	nc.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.ReadAtLeast(nc, reply[:], wire.HeaderSize); err != nil {
		t.Fatal(err)
	}
	key := wire.AppendKVRef(nil, wire.KVRef{Pool: "perf", Key: []byte("k2")})
	h = wire.Header{Op: wire.OpKVPut, ReqID: 2, PayloadLen: uint32(len(v1)), PayloadCRC: crc32c.Checksum(v1), Flags: wire.FlagOverwrite}
	nc.Write(wire.Encode(hb[:], &h, key))
	nc.Write(key)
	nc.Write(v1[:len(v1)/2])
	nc.Close()

	testutil.Eventually(t, 10*time.Second, func() (bool, string) {
		now := [2]int64{used(0), used(1)}
		return now == before, fmt.Sprintf("DRAM used %v, %v before the failed puts", now, before)
	})
	if _, err := kv.Get(ctx, "k2"); !errors.Is(err, errs.ErrNotFound) {
		t.Fatalf("a put cut mid-payload: %v", err)
	}

}
