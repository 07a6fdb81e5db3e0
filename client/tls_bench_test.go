package client_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/gd2fs/gd2fs/client"
	"github.com/gd2fs/gd2fs/internal/cluster"
)

// BenchmarkTLS compares the files and KV paths with TLS off (the reference)
// and on, at 1 MiB per operation, on two clusters of three DRAM servers
// running side by side. Operations alternate between the clusters so load
// from elsewhere on the machine hits both alike. Reported: MB/s of each and
// the ratio tls/plain (docs/benchmarks.md).
//
//	go test -run '^$' -bench BenchmarkTLS -benchtime 200x ./client/
func BenchmarkTLS(b *testing.B) {
	files, err := tlsconfTestCA(b.TempDir())
	if err != nil {
		b.Fatal(err)
	}
	srv, cli := files.server, files.client
	mk := func(tlsOn bool) (*client.Client, func()) {
		cfg := cluster.Config{Dir: b.TempDir(), MemBytes: 1 << 30, KVMemBytes: 1 << 30}
		if tlsOn {
			cfg.TLS, cfg.ClientTLS = srv, cli
		}
		c, err := cluster.Start(context.Background(), cfg)
		if err != nil {
			b.Fatal(err)
		}
		cl := c.Client()
		return cl, func() { cl.Close(); c.Close() }
	}
	plain, stopPlain := mk(false)
	defer stopPlain()
	secure, stopSecure := mk(true)
	defer stopSecure()
	data := rnd(1<<20, 5)
	buf := make([]byte, len(data))
	ctx := context.Background()

	seq := 0 // names stay unique across the runs of each sub-benchmark
	for _, kind := range []string{"files", "kv"} {
		b.Run(kind, func(b *testing.B) {
			op := func(cl *client.Client, i int) time.Duration {
				start := time.Now()
				key := fmt.Sprintf("/bench/%s-%d", kind, i)
				switch kind {
				case "files":
					f, err := cl.Create(ctx, key, client.CreateOptions{Pool: "perf"})
					if err != nil {
						b.Fatal(err)
					}
					if _, err := f.Write(data); err != nil {
						b.Fatal(err)
					}
					if err := f.Close(); err != nil {
						b.Fatal(err)
					}
					g, err := cl.Open(ctx, key)
					if err != nil {
						b.Fatal(err)
					}
					if _, err := g.ReadAt(buf, 0); err != nil {
						b.Fatal(err)
					}
				case "kv":
					if err := cl.KV("perf").Put(ctx, key, data); err != nil {
						b.Fatal(err)
					}
					if _, err := cl.KV("perf").GetInto(ctx, key, buf); err != nil {
						b.Fatal(err)
					}
				}
				return time.Since(start)
			}
			var tPlain, tTLS time.Duration
			b.SetBytes(2 * int64(len(data))) // one write and one read per op
			for range b.N {
				seq++
				tPlain += op(plain, seq)
				tTLS += op(secure, seq)
			}
			mb := float64(2*len(data)*b.N) / 1e6
			b.ReportMetric(mb/tPlain.Seconds(), "plain-MB/s")
			b.ReportMetric(mb/tTLS.Seconds(), "tls-MB/s")
			b.ReportMetric(tPlain.Seconds()/tTLS.Seconds(), "tls/plain")
		})
	}
}
