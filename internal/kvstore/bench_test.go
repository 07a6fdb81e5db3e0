package kvstore

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"
)

// BenchmarkDemotingPuts measures puts of 1 MiB blocks into a store whose
// DRAM tier is full, so every put demotes a block to disk, while 2
// goroutines read blocks that stay in DRAM; it reports the readers' median
// and p99 latency beside the puts' throughput, and writes the same bytes to
// a plain file in the same directory (the reference) in the same run.
//
//	go test -run '^$' -bench DemotingPuts -benchtime 400x ./internal/kvstore
func BenchmarkDemotingPuts(b *testing.B) {
	const size = 1 << 20
	dir := b.TempDir()
	s, err := Open(Config{MemBytes: 64 << 20, Dir: dir, DiskBytes: 256 << 20, SegmentSize: 64 << 20, MaxValue: size})
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	v := val("v", size)
	hot := []byte("hot")
	s.Put(hot, val("hot", 64<<10), false)
	for i := 0; i < 64; i++ { // fill DRAM
		s.Put([]byte(fmt.Sprint("fill", i)), v, false)
	}
	stop := make(chan struct{})
	var mu sync.Mutex
	var lat []time.Duration
	var wg sync.WaitGroup
	for r := 0; r < 2; r++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				t0 := time.Now()
				s.Get(hot, func([][]byte, uint32) error { return nil })
				d := time.Since(t0)
				mu.Lock()
				lat = append(lat, d)
				mu.Unlock()
				time.Sleep(100 * time.Microsecond)
			}
		}()
	}
	b.SetBytes(size)
	b.ResetTimer()
	t0 := time.Now()
	for i := 0; i < b.N; i++ {
		if _, err := s.Put([]byte(fmt.Sprint("k", i)), v, false); err != nil {
			b.Fatal(err)
		}
	}
	el := time.Since(t0)
	b.StopTimer()
	close(stop)
	wg.Wait()
	slices.Sort(lat)
	if len(lat) > 0 {
		b.ReportMetric(float64(lat[len(lat)/2].Microseconds()), "get-p50-µs")
		b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds()), "get-p99-µs")
	}
	// Reference: the same bytes appended to a file with WriteAt.
	f, err := os.Create(filepath.Join(dir, "ref"))
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	r0 := time.Now()
	for i := 0; i < b.N; i++ {
		if _, err := f.WriteAt(v, int64(i%256)*size); err != nil {
			b.Fatal(err)
		}
	}
	ref := time.Since(r0)
	b.ReportMetric(ref.Seconds()/el.Seconds(), "x-of-file-write")
}
