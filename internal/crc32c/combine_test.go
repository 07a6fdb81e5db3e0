package crc32c

import (
	"hash/crc32"
	"math/rand/v2"
	"testing"
)

// TestCombineMatchesChecksum: Combine and NewShift agree with a
// checksum of the concatenation at every length 0..4100 and at lengths
// around each power of two up to 4 MiB, over random bytes and zeros.
func TestCombineMatchesChecksum(t *testing.T) {
	r := rand.New(rand.NewPCG(9, 9))
	buf := make([]byte, 4<<20+64)
	for i := range buf {
		buf[i] = byte(r.Uint32())
	}
	zeros := make([]byte, len(buf))
	var lens []int
	for n := 0; n <= 4100; n++ {
		lens = append(lens, n)
	}
	for p := 1 << 12; p <= 4<<20; p <<= 1 {
		for d := -3; d <= 3; d++ {
			lens = append(lens, p+d)
		}
	}
	for _, data := range [][]byte{buf, zeros} {
		for _, n := range lens {
			a := r.IntN(64)
			A, B := data[:a], data[a:a+n]
			c1, c2 := crc32.Checksum(A, Table), crc32.Checksum(B, Table)
			want := crc32.Checksum(data[:a+n], Table)
			if got := Combine(c1, c2, int64(n)); got != want {
				t.Fatalf("Combine len1=%d len2=%d: %08x, want %08x", a, n, got, want)
			}
			if got := NewShift(int64(n)).Combine(c1, c2); got != want {
				t.Fatalf("NewShift(%d).Combine len1=%d: %08x, want %08x", n, a, got, want)
			}
		}
	}
}

// TestShiftEdges: negative and zero lengths behave as before (no shift),
// and mulMod is commutative, associative and distributive (a field
// product), so xPow8(m+n) = xPow8(m)·xPow8(n) up to 2^63.
func TestShiftEdges(t *testing.T) {
	for _, n := range []int64{0, -1, -64, -1 << 63} {
		for _, crc := range []uint32{0, 1, 0xffffffff, 0x12345678} {
			if got := Combine(crc, 7, n); got != crc^7 {
				t.Fatalf("Combine(%08x, 7, %d) = %08x, want %08x", crc, n, got, crc^7)
			}
			if got := NewShift(n).Combine(crc, 7); got != crc^7 {
				t.Fatalf("NewShift(%d).Combine(%08x, 7) = %08x", n, crc, got)
			}
			if got, want := shiftBy(crc, n), matrixShift(crc, n); got != want {
				t.Fatalf("shiftBy(%08x, %d) = %08x, matrix %08x", crc, n, got, want)
			}
		}
	}
	r := rand.New(rand.NewPCG(5, 6))
	for i := 0; i < 100000; i++ {
		a, b, c := r.Uint32(), r.Uint32(), r.Uint32()
		if mulMod(a, b) != mulMod(b, a) {
			t.Fatalf("mulMod not commutative at %08x %08x", a, b)
		}
		if mulMod(a, b^c) != mulMod(a, b)^mulMod(a, c) {
			t.Fatalf("mulMod not distributive at %08x %08x %08x", a, b, c)
		}
		if mulMod(mulMod(a, b), c) != mulMod(a, mulMod(b, c)) {
			t.Fatalf("mulMod not associative at %08x %08x %08x", a, b, c)
		}
	}
	// x^(8(m+n)) = x^(8m)·x^(8n), across the whole int64 range.
	for i := 0; i < 2000; i++ {
		m, n := r.Int64N(1<<62), r.Int64N(1<<62)
		if xPow8(m+n) != mulMod(xPow8(m), xPow8(n)) {
			t.Fatalf("xPow8(%d+%d) is not the product", m, n)
		}
	}
}

// FuzzCombine compares Combine with a checksum of the concatenation.
func FuzzCombine(f *testing.F) {
	f.Add([]byte("hello"), []byte("world"))
	f.Add([]byte{}, []byte{0})
	f.Fuzz(func(t *testing.T, a, b []byte) {
		want := crc32.Checksum(append(append([]byte{}, a...), b...), Table)
		c1, c2 := crc32.Checksum(a, Table), crc32.Checksum(b, Table)
		if got := Combine(c1, c2, int64(len(b))); got != want {
			t.Fatalf("Combine: %08x, want %08x", got, want)
		}
		if got := NewShift(int64(len(b))).Combine(c1, c2); got != want {
			t.Fatalf("Shift: %08x, want %08x", got, want)
		}
	})
}

// TestShiftEveryBlockLength: for every length internal/store
// combines (0..64 KiB), the new shift equals the matrix method. Both are
// linear in crc, so a difference shows on at least half of random inputs.
func TestShiftEveryBlockLength(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 8))
	for n := int64(0); n <= 64<<10; n++ {
		for j := 0; j < 2; j++ {
			crc := r.Uint32()
			if got, want := shiftBy(crc, n), matrixShift(crc, n); got != want {
				t.Fatalf("shiftBy(%08x, %d) = %08x, matrix %08x", crc, n, got, want)
			}
		}
	}
	crc := r.Uint32()
	if got, want := NewShift(64<<10).Combine(crc, 0), matrixShift(crc, 64<<10); got != want {
		t.Fatalf("NewShift(64 KiB) = %08x, matrix %08x", got, want)
	}
}
