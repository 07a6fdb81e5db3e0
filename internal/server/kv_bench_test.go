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

// BenchmarkKVGet1MiB: 4 clients read 1 MiB values (64 keys in DRAM) into
// their own buffers over the binary protocol, as `gd2fs bench kv` does;
// the figure to profile when GET costs more than its bytes.
func BenchmarkKVGet1MiB(b *testing.B) {
	s, err := New(Config{Listen: "127.0.0.1:0", Store: store.Config{MemBytes: 16 << 20}, KV: kvstore.Config{MemBytes: 256 << 20}})
	if err != nil {
		b.Fatal(err)
	}
	go s.Run(context.Background())
	b.Cleanup(func() { s.Close() })
	p := tcp.NewPool(tcp.Options{Streams: 4})
	defer p.Close()
	val := make([]byte, 1<<20)
	ctx := context.Background()
	const keys = 64
	for i := 0; i < keys; i++ {
		if _, err := p.KVPut(ctx, s.Addr(), wire.KVRef{Pool: "perf", Key: []byte(fmt.Sprint("k", i))}, 0, val, true, 0); err != nil {
			b.Fatal(err)
		}
	}
	b.SetBytes(int64(len(val)))
	var next atomic.Int64
	var wg sync.WaitGroup
	b.ResetTimer()
	for w := 0; w < 4; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			dst := make([]byte, len(val))
			for {
				i := next.Add(1) - 1
				if i >= int64(b.N) {
					return
				}
				if _, err := p.KVGet(ctx, s.Addr(), wire.KVRef{Pool: "perf", Key: []byte(fmt.Sprint("k", i%keys))}, 0, dst); err != nil {
					b.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
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
			s, err := New(Config{Listen: "127.0.0.1:0", Store: store.Config{MemBytes: 16 << 20}, KV: kvstore.Config{MemBytes: mem}})
			if err != nil {
				b.Fatal(err)
			}
			go s.Run(context.Background())
			b.Cleanup(func() { s.Close() })
			p := tcp.NewPool(tcp.Options{Streams: 4})
			defer p.Close()
			val := make([]byte, 1<<20)
			ctx := context.Background()
			const keys = 64
			b.SetBytes(int64(len(val)))
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
						k := i
						if !fresh {
							k = i % keys
						}
						if _, err := p.KVPut(ctx, s.Addr(), wire.KVRef{Pool: "perf", Key: []byte(fmt.Sprint("k", k))}, 0, val, true, 0); err != nil {
							b.Error(err)
							return
						}
					}
				}()
			}
			wg.Wait()
		})
	}
}
