package crc32c

import (
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
