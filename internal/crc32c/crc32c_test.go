package crc32c

import (
	"fmt"
	"hash/crc32"
	"math/rand/v2"
	"testing"
)

func TestCombine(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	buf := make([]byte, 300<<10)
	for i := range buf {
		buf[i] = byte(r.Uint32())
	}
	sh := NewShift(64 << 10)
	for i := 0; i < 200; i++ {
		a := r.IntN(len(buf))
		b := a + r.IntN(len(buf)-a+1)
		whole := crc32.Checksum(buf[:b], Table)
		if got := Combine(crc32.Checksum(buf[:a], Table), crc32.Checksum(buf[a:b], Table), int64(b-a)); got != whole {
			t.Fatalf("combine at %d/%d: %08x, want %08x", a, b, got, whole)
		}
		if b-a == 64<<10 || a+64<<10 <= len(buf) {
			b = a + 64<<10
			if got := sh.Combine(crc32.Checksum(buf[:a], Table), crc32.Checksum(buf[a:b], Table)); got != crc32.Checksum(buf[:b], Table) {
				t.Fatalf("shift combine at %d", a)
			}
		}
	}
}

// matrixShift is the 32×32 bit-matrix method (zlib's crc32_combine before
// 1.2.12) that shiftBy replaced, kept as a reference for lengths too long
// to checksum.
func matrixShift(crc uint32, len2 int64) uint32 {
	times := func(m *[32]uint32, v uint32) (sum uint32) {
		for i := 0; v != 0; i, v = i+1, v>>1 {
			if v&1 != 0 {
				sum ^= m[i]
			}
		}
		return sum
	}
	square := func(dst, of *[32]uint32) {
		for n := range dst {
			dst[n] = times(of, of[n])
		}
	}
	var even, odd [32]uint32
	odd[0] = poly
	for n, row := 1, uint32(1); n < 32; n, row = n+1, row<<1 {
		odd[n] = row
	}
	square(&even, &odd)
	square(&odd, &even)
	for len2 > 0 {
		square(&even, &odd)
		if len2&1 != 0 {
			crc = times(&even, crc)
		}
		if len2 >>= 1; len2 == 0 {
			break
		}
		square(&odd, &even)
		if len2&1 != 0 {
			crc = times(&odd, crc)
		}
		len2 >>= 1
	}
	return crc
}

func TestShiftMatchesMatrix(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	lens := []int64{0, 1, 2, 3, 7, 8, 255, 4096, 53248, 64 << 10, 1<<62 + 12345, 1<<63 - 1}
	for i := 0; i < 300; i++ {
		lens = append(lens, r.Int64N(1<<uint(1+r.IntN(62))))
	}
	for _, n := range lens {
		crc := r.Uint32()
		if got, want := shiftBy(crc, n), matrixShift(crc, n); got != want {
			t.Fatalf("shiftBy(%08x, %d) = %08x, the matrix method gives %08x", crc, n, got, want)
		}
		if got, want := NewShift(n).Combine(crc, 0x1234), matrixShift(crc, n)^0x1234; got != want {
			t.Fatalf("NewShift(%d).Combine = %08x, want %08x", n, got, want)
		}
	}
}

func BenchmarkCombine(b *testing.B) {
	for i := 0; i < b.N; i++ {
		Combine(uint32(i), 7, 53248)
	}
}

func BenchmarkCombineMatrix(b *testing.B) {
	for i := 0; i < b.N; i++ {
		matrixShift(uint32(i), 53248)
	}
}

// BenchmarkChecksum is one CRC32C pass over a buffer that stays in the CPU's
// cache (64 KiB, 256 KiB: what a receiver sums right after a read) and over
// one that does not (256 MiB): the per-byte cost the byte's-cost bounds of
// docs/benchmarks.md count once per receiving process.
func BenchmarkChecksum(b *testing.B) {
	for _, n := range []int{64 << 10, 256 << 10, 256 << 20} {
		buf := make([]byte, n)
		for i := range buf {
			buf[i] = byte(i * 7)
		}
		b.Run(fmt.Sprintf("%dKiB", n>>10), func(b *testing.B) {
			b.SetBytes(int64(n))
			for i := 0; i < b.N; i++ {
				Checksum(buf)
			}
		})
	}
}
