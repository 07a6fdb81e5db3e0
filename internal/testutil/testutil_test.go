package testutil

import (
	"bytes"
	"testing"
	"time"
)

func TestEventually(t *testing.T) {
	n := 0
	Eventually(t, 10*time.Second, func() (bool, string) { n++; return n == 5, "counting" })
	if n != 5 {
		t.Fatalf("cond called %d times, want 5", n)
	}
	if !bytes.Equal(RandomBytes(100, 3), RandomBytes(100, 3)) || bytes.Equal(RandomBytes(100, 3), RandomBytes(100, 4)) {
		t.Fatal("RandomBytes is not a function of its seed")
	}
}
