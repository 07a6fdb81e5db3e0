package bench

import "testing"

// TestBuffer: both kinds of buffer are n zeroed, writable bytes.
func TestBuffer(t *testing.T) {
	defer func(h bool) { HugeBuffers = h }(HugeBuffers)
	for _, huge := range []bool{false, true} {
		HugeBuffers = huge
		b := Buffer(4<<20 + 5)
		if len(b) != 4<<20+5 {
			t.Fatalf("huge %v: %d bytes", huge, len(b))
		}
		for i := 0; i < len(b); i += 4093 {
			if b[i] != 0 {
				t.Fatalf("huge %v: byte %d is %d", huge, i, b[i])
			}
			b[i] = byte(i)
		}
		if b[4093] != byte(4093%256) {
			t.Fatalf("huge %v: not writable", huge)
		}
	}
	if b := Buffer(0); len(b) != 0 {
		t.Fatalf("Buffer(0): %d bytes", len(b))
	}
}
