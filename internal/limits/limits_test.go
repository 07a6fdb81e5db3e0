package limits

import (
	"math"
	"testing"
	"time"
)

func TestMul(t *testing.T) {
	for _, c := range []struct {
		a, b, want int64
		ok         bool
	}{
		{0, math.MaxInt64, 0, true},
		{3, 4, 12, true},
		{1 << 31, 1 << 31, 1 << 62, true},
		{1 << 32, 1 << 31, 0, false},
		{math.MaxInt64, 2, 0, false},
		{-1, 2, 0, false},
		{2, -1, 0, false},
	} {
		got, ok := Mul(c.a, c.b)
		if got != c.want || ok != c.ok {
			t.Errorf("Mul(%d, %d) = %d, %v; want %d, %v", c.a, c.b, got, ok, c.want, c.ok)
		}
	}
	if _, ok := MulAll(2, 1<<62, 4096, 8, 128, 2); ok {
		t.Error("MulAll overflow not reported")
	}
	if p, ok := MulAll(2, 32, 8, 128, 2); !ok || p != 131072 {
		t.Errorf("MulAll = %d, %v", p, ok)
	}
	if _, ok := Add(math.MaxInt64, 1); ok {
		t.Error("Add overflow not reported")
	}
	if CeilDiv(math.MaxInt64, 16) != math.MaxInt64/16+1 || CeilDiv(32, 16) != 2 || CeilDiv(0, 16) != 0 {
		t.Error("CeilDiv")
	}
}

func TestTTLMillis(t *testing.T) {
	for _, ms := range []int64{1 << 62, math.MaxInt64, 9_300_000_000_000} {
		if d := TTLMillis(ms); d != MaxTTL {
			t.Errorf("TTLMillis(%d) = %v, want MaxTTL", ms, d)
		}
	}
	if d := TTLMillis(1500); d != 1500*time.Millisecond {
		t.Errorf("TTLMillis(1500) = %v", d)
	}
	now := time.Unix(1_800_000_000, 0)
	if at := ClampExpiry(time.Date(3000, 1, 1, 0, 0, 0, 0, time.UTC), now); !at.Equal(now.Add(MaxTTL)) {
		t.Errorf("ClampExpiry(3000) = %v", at)
	}
}
