package main

import (
	"bytes"
	"testing"
)

// sizes records the size of every Read it is asked for.
type sizes struct {
	r     *bytes.Reader
	asked []int
}

func (s *sizes) Read(p []byte) (int, error) {
	s.asked = append(s.asked, len(p))
	return s.r.Read(p)
}

// TestReadAllReadsMiB: the mount benchmark's read asks for 1 MiB at a time,
// as cat does (it asked for 8 KiB through io.Discard's ReadFrom).
func TestReadAllReadsMiB(t *testing.T) {
	s := &sizes{r: bytes.NewReader(make([]byte, 5<<20+3))}
	if err := readAll(s); err != nil {
		t.Fatal(err)
	}
	if len(s.asked) != 7 { // 6 reads of data, one at EOF
		t.Fatalf("%d reads for 5 MiB: %v", len(s.asked), s.asked[:min(len(s.asked), 10)])
	}
	for _, n := range s.asked {
		if n != 1<<20 {
			t.Fatalf("a read of %d bytes, want 1 MiB", n)
		}
	}
}
