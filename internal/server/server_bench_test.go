package server

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/gd2fs/gd2fs/internal/store"
	"github.com/gd2fs/gd2fs/internal/tcp"
)

func startBench(b *testing.B, sc store.Config) *Server {
	s, err := New(Config{Listen: "127.0.0.1:0", Store: sc})
	if err != nil {
		b.Fatal(err)
	}
	go s.Run(context.Background())
	b.Cleanup(func() { s.Close() })
	return s
}

// BenchmarkServerWrite drives one server with 16 writers of 4 MiB pieces,
// each writer on its own chunk, over 4 streams.
func BenchmarkServerWrite(b *testing.B) {
	for _, tc := range []struct {
		name string
		sc   store.Config
	}{
		{"dram", store.Config{MemBytes: 2 << 30}},
		{"disk", store.Config{Dir: b.TempDir(), DiskBytes: 8 << 30}},
	} {
		b.Run(tc.name, func(b *testing.B) {
			s := startBench(b, tc.sc)
			p := tcp.NewPool(tcp.Options{Streams: 4})
			defer p.Close()
			data := make([]byte, 4<<20)
			b.SetBytes(int64(len(data)))
			var next atomic.Int64
			var wg sync.WaitGroup
			b.ResetTimer()
			for w := 0; w < 16; w++ {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for {
						i := next.Add(1) - 1
						if i >= int64(b.N) {
							return
						}
						id := uint64(i/4) + 1
						if err := p.WriteChunk(context.Background(), s.Addr(), id, (i%4)*int64(len(data)), data, nil); err != nil {
							b.Error(err)
							return
						}
						if i%4 == 3 {
							s.store.Delete(id)
						}
					}
				}()
			}
			wg.Wait()
		})
	}
}
