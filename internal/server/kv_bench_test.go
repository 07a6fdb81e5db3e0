package server

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/gd2fs/gd2fs/internal/kvstore"
	"github.com/gd2fs/gd2fs/internal/store"
	"github.com/gd2fs/gd2fs/internal/tcp"
	"github.com/gd2fs/gd2fs/internal/wire"
)

// startKVBench runs a standalone server with a KV DRAM tier of kvMem bytes
// and returns a client pool of 4 streams to it.
func startKVBench(b *testing.B, kvMem int64) (*Server, *tcp.Pool) {
	b.Helper()
	s, err := New(Config{Listen: "127.0.0.1:0", Store: store.Config{MemBytes: 16 << 20}, KV: kvstore.Config{MemBytes: kvMem}})
	if err != nil {
		b.Fatal(err)
	}
	go s.Run(context.Background())
	b.Cleanup(func() { s.Close() })
	p := tcp.NewPool(tcp.Options{Streams: 4})
	b.Cleanup(func() { p.Close() })
	return s, p
}

// eachOp runs op(i) for i in [0, b.N) on 4 workers, timing only that.
func eachOp(b *testing.B, op func(i int64) error) {
	var next atomic.Int64
	var wg sync.WaitGroup
	b.ResetTimer()
	for w := 0; w < 4; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := next.Add(1) - 1
				if i >= int64(b.N) {
					return
				}
				if err := op(i); err != nil {
					b.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
}

func kvRef(k int64) wire.KVRef { return wire.KVRef{Pool: "perf", Key: []byte(fmt.Sprint("k", k))} }

// BenchmarkKVGet1MiB: 4 clients read 1 MiB values (64 keys in DRAM) into
// their own buffers over the binary protocol, as `gd2fs bench kv` does;
// the figure to profile when GET costs more than its bytes.
func BenchmarkKVGet1MiB(b *testing.B) {
	s, p := startKVBench(b, 256<<20)
	val := make([]byte, 1<<20)
	ctx := context.Background()
	const keys = 64
	for i := range int64(keys) {
		if _, err := p.KVPut(ctx, s.Addr(), kvRef(i), 0, val, true, 0); err != nil {
			b.Fatal(err)
		}
	}
	b.SetBytes(int64(len(val)))
	var bufs sync.Pool
	eachOp(b, func(i int64) error {
		dst, _ := bufs.Get().([]byte)
		if dst == nil {
			dst = make([]byte, len(val))
		}
		defer bufs.Put(dst)
		_, err := p.KVGet(ctx, s.Addr(), kvRef(i%keys), 0, dst)
		return err
	})
}

// BenchmarkKVPut1MiB: 4 clients put 1 MiB values over the binary protocol.
// "reused": 64 keys overwritten in turn, so the DRAM pages a put takes
// were touched before (a tier in its steady state); "fresh": every put a
// new key into pages never touched (a tier filling up: on VMs that trap a
// page's first touch, that trap is much of the cost).
func BenchmarkKVPut1MiB(b *testing.B) {
	for _, fresh := range []bool{false, true} {
		name := "reused"
		if fresh {
			name = "fresh"
		}
		b.Run(name, func(b *testing.B) {
			mem := int64(256 << 20)
			if fresh {
				mem = int64(b.N+64) << 20
			}
			s, p := startKVBench(b, mem)
			val := make([]byte, 1<<20)
			ctx := context.Background()
			b.SetBytes(int64(len(val)))
			eachOp(b, func(i int64) error {
				k := i
				if !fresh {
					k = i % 64
				}
				_, err := p.KVPut(ctx, s.Addr(), kvRef(k), 0, val, true, 0)
				return err
			})
		})
	}
}
