package main

import (
	"os"
	"testing"
	"time"
)

// TestProcCPU: this process's CPU time grows while it spins.
func TestProcCPU(t *testing.T) {
	before, err := procCPU(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	x := 0
	for start := time.Now(); time.Since(start) < 100*time.Millisecond; {
		x++
	}
	after, err := procCPU(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if after <= before {
		t.Fatalf("CPU time did not grow: %v -> %v (%d)", before, after, x)
	}
}
