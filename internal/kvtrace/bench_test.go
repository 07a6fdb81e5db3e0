package kvtrace

import (
	"os"
	"testing"
)

// BenchmarkKVTrace prints the prefix-hit ratio of gd2fs's KV store, an exact
// LRU and Belady at DRAM = 10% and 25% of the distinct blocks, and the
// store's throughput. Run it once:
//
//	go test -run '^$' -bench KVTrace -benchtime 1x ./internal/kvtrace
//
// GD2FS_KVTRACE=file.jsonl replays a trace file instead of a synthetic one;
// GD2FS_KVTRACE_GEN="requests=20000,mean_think_ms=60000" sets the generator
// (ParseGen lists the names); GD2FS_KVTRACE_WRITE=file.jsonl saves the
// synthetic trace.
func BenchmarkKVTrace(b *testing.B) {
	var reqs []Request
	if path := os.Getenv("GD2FS_KVTRACE"); path != "" {
		f, err := os.Open(path)
		if err != nil {
			b.Fatal(err)
		}
		reqs, err = Read(f)
		f.Close()
		if err != nil {
			b.Fatal(err)
		}
	} else {
		c, err := ParseGen(DefaultGen(), os.Getenv("GD2FS_KVTRACE_GEN"))
		if err != nil {
			b.Fatal(err)
		}
		reqs = Generate(c)
		if path := os.Getenv("GD2FS_KVTRACE_WRITE"); path != "" {
			f, err := os.Create(path)
			if err != nil {
				b.Fatal(err)
			}
			if err := Write(f, reqs); err != nil {
				b.Fatal(err)
			}
			f.Close()
		}
	}
	for i := 0; i < b.N; i++ {
		if err := Report(os.Stdout, reqs, []float64{0.10, 0.25}, 16<<10); err != nil {
			b.Fatal(err)
		}
	}
}
