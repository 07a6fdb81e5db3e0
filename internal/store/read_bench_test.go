package store

import (
	"os"
	"testing"
	"time"
)

// BenchmarkDiskRead reads a 16 MiB chunk of the disk tier (no DRAM tier;
// the file is in the page cache) in 4 MiB pieces, each verified against
// its block CRCs, and in the same run the same bytes with plain preads
// into one buffer: the reference, whose copy out of the page cache every
// disk read pays. It reports the ratio of their times (1.00 = verifying
// costs nothing).
func BenchmarkDiskRead(b *testing.B) {
	const size, piece = 16 << 20, 4 << 20
	dir := b.TempDir()
	s, err := Open(Config{Dir: dir, DiskBytes: 64 << 20})
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	if err := s.Write(1, 0, rnd(size, 1)); err != nil {
		b.Fatal(err)
	}
	f, err := os.Open(s.path(1))
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	buf := make([]byte, piece)
	var ours, ref time.Duration
	b.SetBytes(size)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		t0 := time.Now()
		for off := int64(0); off < size; off += piece {
			if err := s.Read(1, off, piece, func([][]byte, uint32) error { return nil }); err != nil {
				b.Fatal(err)
			}
		}
		t1 := time.Now()
		for off := int64(0); off < size; off += piece {
			if _, err := f.ReadAt(buf, dataOff+off); err != nil {
				b.Fatal(err)
			}
		}
		ours, ref = ours+t1.Sub(t0), ref+time.Since(t1)
	}
	b.ReportMetric(float64(ours)/float64(ref), "x-pread")
}
